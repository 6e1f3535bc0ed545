// The setup commands of the Local CLI connection panel, quoted for a POSIX shell. The flags are
// those of `agentworks executor connect` (crates/laptop/src/cli.rs): --folder PATH (read-only),
// --write-folder PATH, --read-only PATH and --block PATH (each inside a shared folder, each
// repeatable) and --downloads.

// Characters a POSIX shell takes literally in an unquoted word.
const PLAIN = /^[A-Za-z0-9_@%+=:,./-]+$/;

// One shell word that the shell turns back into exactly `word`: as it is when every character
// is plain, else in single quotes, each ' written as '\'' (close, escaped quote, reopen).
export function shellQuote(word) {
  const text = String(word);
  if (PLAIN.test(text)) return text;
  return `'${text.replaceAll("'", "'\\''")}'`;
}

// A path as a shell word. A leading `~` or `~/` stays unquoted so the shell expands it to the
// home directory (quoted, it would be a folder literally named ~); a path starting with `-`
// gets `./` so the CLI cannot read it as a flag.
export function quotePath(path) {
  const text = String(path);
  if (text === '~') return '~';
  if (text.startsWith('~/')) {
    const rest = text.slice(2);
    return rest === '' ? '~/' : `~/${shellQuote(rest)}`;
  }
  if (text.startsWith('-')) return shellQuote(`./${text}`);
  return shellQuote(text);
}

// A path given for --read-only or --block: as given when absolute (or from ~), else taken
// inside `folder` (the CLI resolves relative paths from the directory it runs in, which
// is not necessarily the folder).
export function insideFolder(folder, sub) {
  const path = String(sub).trim();
  if (path.startsWith('/') || path === '~' || path.startsWith('~/')) return path;
  const base = String(folder).replace(/\/+$/, '');
  return `${base}/${path.replace(/^(\.\/)+/, '')}`;
}

// Why `path` cannot be shared as given, or null.
export function pathProblem(path) {
  const text = String(path).trim();
  if (text === '') return 'give the folder to share';
  if (text.includes('\u0000')) return 'a path cannot contain a NUL character';
  return null;
}

// `agentworks login --server <origin>`.
export function loginCommand(origin) {
  return `agentworks login --server ${shellQuote(origin)}`;
}

// The `agentworks executor connect` command for one folder:
// {folder, writable, readOnly: [paths], block: [paths], downloads}. Blank list entries are
// dropped; --read-only is only given for a writable folder (a read-only folder is read-only
// throughout).
export function connectCommand({ folder, writable = false, readOnly = [], block = [], downloads = false }) {
  const root = String(folder).trim();
  const words = ['agentworks', 'executor', 'connect', writable ? '--write-folder' : '--folder', quotePath(root)];
  const entries = (list) => list.map((p) => String(p).trim()).filter((p) => p !== '');
  if (writable) {
    for (const path of entries(readOnly)) words.push('--read-only', quotePath(insideFolder(root, path)));
  }
  for (const path of entries(block)) words.push('--block', quotePath(insideFolder(root, path)));
  if (downloads) words.push('--downloads');
  return words.join(' ');
}
