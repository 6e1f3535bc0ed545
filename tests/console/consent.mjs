// A person consenting to an MCP client in Debian's chromium: opens an authorization URL
// (agentd's /oauth/authorize), signs in when the console asks, checks what the consent page
// shows, makes the choices and presses Allow or Deny. The browser's navigation to the client's
// redirect URI is caught (answered here with a small page, whether or not anything listens
// there) and printed as `REDIRECT <url>`; the caller hands it to the client.
//
// Reads AGENTWORKS_CONSENT (JSON):
//   url        the authorization URL
//   username, password   the person's sign-in when the console asks for it, or
//   sign_in_link         a one-time sign-in link (agentworksctl quickstart prints one), opened first
//   deliver              let the browser's request reach the redirect URI (a client listening
//                        there, such as the conformance suite) instead of answering it here
//   redirect   the redirect URI's prefix (what to catch)
//   decision   "allow" (default) or "deny"
//   projects   names to leave checked (default: all)
//   writable   lines for "Writable folders" (default: leave the prefilled authoring paths)
//   expect     {client_name?, client_label? ("unverified", or a metadata document's host),
//              scopes?: [...], writes?: bool, checked?: [project names checked before any
//              change]} checked on the page
//   shot       a PNG path for a screenshot of the consent page (optional)
//   revoke     a client name: after REDIRECT, wait for a line `revoke` on stdin (the caller
//              has exchanged the code meanwhile), then revoke the app on the console's
//              Connected apps page and print `REVOKED`
// Prints `REDIRECT <url>`, then `ok`; exits non-zero with the reason on any failure.
import { createInterface } from 'node:readline';
import { chromium } from './node_modules/playwright-core/index.mjs';

const config = JSON.parse(process.env.AGENTWORKS_CONSENT);
const T = 20000;
const started = Date.now();
const step = (what) => process.stderr.write(`consent.mjs: ${((Date.now() - started) / 1000).toFixed(1)} s: ${what}\n`);
function check(condition, message) { if (!condition) throw new Error(message); }

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const context = await browser.newContext({ viewport: { width: 1100, height: 900 } });
  const page = await context.newPage();
  let caught = null;
  if (process.env.CONSENT_TRACE) {
    page.on('request', (r) => step(`request ${r.method()} ${r.url()}`));
    page.on('requestfinished', (r) => step(`finished ${r.url()}`));
    page.on('requestfailed', (r) => step(`failed ${r.url()} ${r.failure()?.errorText}`));
  }
  page.on('pageerror', (e) => step(`page error: ${e.message}`));
  await page.route((url) => url.href.startsWith(config.redirect), async (route) => {
    caught = route.request().url();
    if (config.deliver) await route.continue();
    else await route.fulfill({ status: 200, contentType: 'text/plain', body: 'returned to the client' });
  });
  if (config.sign_in_link) {
    await page.goto(config.sign_in_link);
    await page.getByText(/^Signed in as /).waitFor({ timeout: T });
    step('signed in with the link');
  }
  step(`open ${config.url}`);
  await page.goto(config.url);
  step(`at ${page.url()}`);
  if (!config.sign_in_link) {
    // Signed out: the console's sign-in, which comes back to the consent page.
    await page.getByLabel('Username', { exact: true }).waitFor({ timeout: T });
    check(page.url().includes('/console/sign-in?next='), `not the sign-in page: ${page.url()}`);
    await page.getByLabel('Username', { exact: true }).fill(config.username);
    await page.getByLabel('Password', { exact: true }).fill(config.password);
    await page.getByRole('button', { name: 'Sign in' }).click();
    step('signed in');
  }
  const heading = page.getByRole('heading', { level: 1 });
  await page.getByRole('button', { name: 'Allow', exact: true }).waitFor({ timeout: T });
  check(new URL(page.url()).pathname === '/oauth/consent', `not the consent page: ${page.url()}`);
  const title = (await heading.textContent()) || '';
  const want = config.expect || {};
  // The name with how far it can be trusted: `unverified` for a registered app, the host of a
  // metadata document's client id otherwise (expect.client_label).
  if (want.client_name) {
    check(title === `Allow ${want.client_name} (${want.client_label}) to use agentworks?`, `heading: ${title}`);
  }
  const body = (await page.locator('main').textContent()) || '';
  for (const scope of want.scopes || []) check(body.includes(scope), `the page does not show ${scope}`);
  const writable = page.getByLabel('Writable folders', { exact: true });
  if (want.writes !== undefined) {
    check((await writable.count()) === (want.writes ? 1 : 0), `writable folders field present: ${await writable.count()}`);
  }
  if (want.checked) {
    const checked = [];
    for (const box of await page.locator('fieldset input[type=checkbox]').all()) {
      const id = await box.getAttribute('id');
      if (await box.isChecked()) checked.push(((await page.locator(`label[for="${id}"]`).textContent()) || '').trim());
    }
    check(JSON.stringify(checked.sort()) === JSON.stringify([...want.checked].sort()), `checked by default: ${checked}`);
  }
  if (config.projects) {
    for (const box of await page.locator('fieldset input[type=checkbox]').all()) {
      const id = await box.getAttribute('id');
      const name = ((await page.locator(`label[for="${id}"]`).textContent()) || '').trim();
      if (config.projects.includes(name)) await box.check(); else await box.uncheck();
    }
  }
  if (config.writable) await writable.fill(config.writable.join('\n'));
  if (config.shot) await page.screenshot({ path: config.shot, fullPage: true });
  step('choices made');
  const decision = config.decision === 'deny' ? 'Deny' : 'Allow';
  await page.getByRole('button', { name: decision, exact: true }).click();
  step('clicked');
  const deadline = Date.now() + T;
  while (!caught && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  if (!caught) {
    const status = await page.locator('#status').textContent({ timeout: 1000 }).catch(() => '');
    throw new Error(`the browser was not sent to ${config.redirect} (page: ${page.url()}, status: ${status})`);
  }
  step('returned to the client');
  process.stdout.write(`REDIRECT ${caught}\n`);
  if (config.revoke) {
    const input = createInterface({ input: process.stdin });
    const line = await new Promise((resolve) => input.once('line', resolve));
    input.close();
    step('revoking');
    check(line === 'revoke', `the caller answered ${line}`);
    await page.goto(new URL('/console/apps', config.url).href);
    const button = page.getByRole('button', { name: `Revoke ${config.revoke}`, exact: true });
    await button.waitFor({ timeout: T });
    if (config.apps_shot) await page.screenshot({ path: config.apps_shot, fullPage: true });
    await button.click();
    const status = page.locator('#status');
    const until = Date.now() + T;
    while (!((await status.textContent()) || '').startsWith(`Revoked ${config.revoke}`) && Date.now() < until) {
      await new Promise((r) => setTimeout(r, 50));
    }
    check(((await status.textContent()) || '').startsWith(`Revoked ${config.revoke}`), `status: ${await status.textContent()}`);
    check((await button.count()) === 0, 'the revoked app is still listed');
    step('revoked');
    process.stdout.write('REVOKED\n');
  }
  process.stdout.write('ok\n');
} catch (error) {
  process.stderr.write(`consent.mjs: ${error.stack || error}\n`);
  process.exitCode = 1;
} finally {
  await browser.close();
  // stdin may still be open (the caller keeps it): do not wait for it.
  process.exit();
}
