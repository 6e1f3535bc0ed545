// What the OAuth pages share: the scopes in plain words, the server's `{error,
// error_description}` answers in words, and the one-folder-per-line fields. Pure functions.

const SCOPES = {
  'workflows:read': 'See the workflows, their runs and their files in the chosen projects.',
  'workflows:run': 'Start runs of those workflows.',
  'workflows:write': 'Change workflow and code files, only in the writable folders.',
};

// A scope's meaning, in words.
export function scopeMeaning(scope) {
  return SCOPES[scope] || 'A permission this console does not know.';
}

// What went wrong with a call to the console's OAuth API, in words.
export function problem(answer) {
  const body = answer.body || {};
  if (answer.status === 0) return 'Cannot reach the server. Try again.';
  if (typeof body.error_description === 'string' && body.error_description !== '') return body.error_description;
  if (typeof body.error === 'string') return `The server answered ${answer.status} (${body.error}).`;
  if (body.error && typeof body.error.message === 'string') return body.error.message;
  return `The server answered ${answer.status}.`;
}

// The folders of a one-per-line field: trimmed, without empty lines or repeats.
export function folderLines(text) {
  return [...new Set(text.split('\n').map((line) => line.trim()).filter((line) => line !== ''))];
}

// Every authoring path of `projects`, each once, in the order first seen.
export function authoringUnion(projects) {
  return [...new Set(projects.flatMap((p) => p.authoring_paths || []))];
}
