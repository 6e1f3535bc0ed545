// A person signing a project's MCP connection in to its OAuth server in Debian's chromium:
// signs in to the console, sends a message in a chat of the project (the turn says the server
// is not available and links to the settings), follows that link to the project's settings
// page, presses "Sign in to <name>",
// and follows the server's authorization page (which approves at once in the test server)
// back to the settings page, which must say the connection is signed in.
//
// Reads AGENTWORKS_CONNECTION_SIGN_IN (JSON):
//   chat_url       a chat of the project (its next turn has the connection unavailable)
//   username, password   the console sign-in
//   connection     the connection's name
//   authorization_origin   where the sign-in must go (checked as the browser passes)
//   shot           a PNG path for a screenshot of the page at the end (optional)
// Prints `ok`; exits non-zero with the reason on any failure.
import { chromium } from './node_modules/playwright-core/index.mjs';

const config = JSON.parse(process.env.AGENTWORKS_CONNECTION_SIGN_IN);
const T = 20000;
function check(condition, message) { if (!condition) throw new Error(message); }

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
let failed = null;
let page = null;
// What the browser showed and asked for, printed with a failure (a timeout alone says nothing).
const answers = [];
try {
  // The test server's certificate comes from the test's own CA, which this browser does not
  // know: only that server is reached over https.
  const context = await browser.newContext({ viewport: { width: 1100, height: 900 }, ignoreHTTPSErrors: true });
  page = await context.newPage();
  page.on('response', (r) => { if (r.url().includes('/v1/')) answers.push(`${r.request().method()} ${new URL(r.url()).pathname} ${r.status()}`); });
  page.on('console', (m) => { if (m.type() === 'error') answers.push(`console error: ${m.text()}`); });
  const visited = [];
  page.on('request', (r) => { if (r.isNavigationRequest()) visited.push(r.url()); });
  await page.goto(config.chat_url);
  await page.getByLabel('Username', { exact: true }).fill(config.username);
  await page.getByLabel('Password', { exact: true }).fill(config.password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  const message = page.getByRole('textbox', { name: 'Message', exact: true });
  await message.waitFor({ timeout: T });
  await message.fill('use the remote tools');
  await page.getByRole('button', { name: 'Send' }).click();
  const reconnect = page.getByRole('link', { name: `Reconnect ${config.connection} in the project's settings` });
  await reconnect.waitFor({ timeout: T });
  await reconnect.click();
  await page.getByRole('heading', { name: /settings$/ }).waitFor({ timeout: T });
  const list = page.getByRole('list', { name: 'MCP connections' });
  await list.getByText('not signed in').waitFor({ timeout: T });
  await page.getByRole('button', { name: `Sign in to ${config.connection}` }).click();
  await page.getByRole('status').filter({ hasText: `Signed in to ${config.connection}` }).waitFor({ timeout: T });
  check(visited.some((u) => u.startsWith(`${config.authorization_origin}/authorize?`)),
    `the browser never went to the authorization page: ${visited.join(' ')}`);
  check(new URL(page.url()).search === '', `the outcome stayed in the address: ${page.url()}`);
  await list.getByText('signed in', { exact: true }).waitFor({ timeout: T });
  if (config.shot) await page.screenshot({ path: config.shot, fullPage: true });
} catch (e) {
  failed = e;
  if (page) {
    try {
      const shown = await page.evaluate(() => document.body.innerText);
      failed.message += `\nat ${page.url()}\npage text: ${shown.replace(/\s+/g, ' ').slice(0, 600)}`;
    } catch (e2) { failed.message += `\n(page state unreadable: ${e2.message})`; }
  }
  failed.message += `\nanswers: ${answers.join(', ')}`;
}
await browser.close();
if (failed) {
  process.stderr.write(`connection-sign-in.mjs: ${failed.message}\n`);
  process.exit(1);
}
process.stdout.write('ok\n');
