// The web console in Debian's chromium, driven by tests/suite/console.rs against the real
// daemons. Reads AGENTWORKS_CONSOLE_CONFIG (JSON: url, username, password, wrong_password,
// image, text_file, sign_in_link, scenarios) and writes one screenshot per scenario into AGENTWORKS_CONSOLE_SCREENSHOTS.
// Prints one JSON line per scenario; exits non-zero on the first failure.
//
// What only the Rust side can do (script the model, check its request log, stop the executor)
// is asked for on stdout as `NEED <what>`; the test answers on stdin `ok` or `fail <reason>`.
import { readFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { createServer } from 'node:http';
import { chromium } from './node_modules/playwright-core/index.mjs';

// playwright-core has no `expect`: a small polling one, for the assertions used here.
function expect(locator) {
  const poll = async (what, test, timeout = 5000) => {
    const deadline = Date.now() + timeout;
    let last;
    for (;;) {
      try { last = await test(); if (last === true) return; } catch (e) { last = e.message; }
      if (Date.now() > deadline) throw new Error(`expected ${locator} ${what} (last: ${JSON.stringify(last)})`);
      await new Promise((r) => setTimeout(r, 100));
    }
  };
  const text = async () => (await locator.textContent({ timeout: 1000 })) || '';
  return {
    toBeVisible: (o = {}) => poll('to be visible', () => locator.isVisible(), o.timeout),
    toBeHidden: (o = {}) => poll('to be hidden', async () => !(await locator.isVisible()), o.timeout),
    toBeEnabled: (o = {}) => poll('to be enabled', () => locator.isEnabled({ timeout: 1000 }), o.timeout),
    toBeDisabled: (o = {}) => poll('to be disabled', () => locator.isDisabled({ timeout: 1000 }), o.timeout),
    toContainText: (t, o = {}) => poll(`to contain ${t}`, async () => (await text()).includes(t) || await text(), o.timeout),
    toHaveText: (t, o = {}) => poll(`to have text ${t}`, async () => (await text()).trim() === t || await text(), o.timeout),
    toHaveCount: (n, o = {}) => poll(`to count ${n}`, async () => (await locator.count()) === n || await locator.count(), o.timeout),
    not: { toBeEmpty: (o = {}) => poll('not to be empty', async () => (await text()).trim() !== '', o.timeout) },
  };
}

const config = JSON.parse(readFileSync(process.env.AGENTWORKS_CONSOLE_CONFIG, 'utf8'));
const shots = process.env.AGENTWORKS_CONSOLE_SCREENSHOTS || mkdtempSync(join(tmpdir(), 'aw-console-shots-'));
const base = config.url.replace(/\/$/, '');
const T = 20000;

const stdin = createInterface({ input: process.stdin });
const answers = [];
let waiting = null;
stdin.on('line', (line) => { if (waiting) { const w = waiting; waiting = null; w(line); } else answers.push(line); });
async function need(what) {
  process.stdout.write(`NEED ${what}\n`);
  const line = answers.length ? answers.shift() : await new Promise((resolve) => { waiting = resolve; });
  if (line !== 'ok') throw new Error(`the test answered ${what}: ${line}`);
}
function check(condition, message) { if (!condition) throw new Error(message); }

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
const page = await context.newPage();
let dialogs = 0;
page.on('dialog', async (dialog) => { dialogs += 1; await dialog.dismiss(); });
const composer = () => page.getByRole('form', { name: 'New message' });

async function send(message) {
  await page.getByRole('textbox', { name: 'Message', exact: true }).fill(message);
  await page.getByRole('button', { name: 'Send' }).click();
}
const lastAnswer = () => page.locator('li.msg.assistant').last();

const scenarios = {
  async 'sign-in'() {
    await page.goto(`${base}/console/`);
    await page.getByLabel('Username', { exact: true }).fill(config.username);
    await page.getByLabel('Password', { exact: true }).fill(config.wrong_password);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await expect(page.getByRole('alert')).toBeVisible({ timeout: T });
    await expect(page.getByRole('alert')).not.toBeEmpty();
    check(!(await page.getByText(`Signed in as ${config.username}`).isVisible()), 'a wrong password signed in');
    await page.getByLabel('Password', { exact: true }).fill(config.password);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await expect(page.getByText(`Signed in as ${config.username}`)).toBeVisible({ timeout: T });
  },
  async 'new-chat'() {
    await page.getByRole('button', { name: 'New chat' }).first().click();
    // New chat asks which agent and which mode (issue 45): without runnerd, only the built-in
    // agent, in Run mode, and the form says why no coding CLI is offered.
    const form = page.getByRole('form', { name: /^New chat in / }).first();
    const agent = form.getByLabel('Agent', { exact: true });
    await expect(agent.locator('option')).toHaveCount(1, { timeout: T });
    check((await agent.inputValue()) === 'api', `the agent offered: ${await agent.inputValue()}`);
    const mode = form.getByLabel('Mode', { exact: true });
    const modes = await mode.locator('option').evaluateAll((options) => options.map((o) => o.value));
    check(JSON.stringify(modes) === '["run"]', `the modes offered: ${modes}`);
    await expect(form).toContainText('runnerd is not running');
    await form.getByRole('button', { name: 'Start chat' }).click();
    await expect(page.getByRole('textbox', { name: 'Message', exact: true })).toBeVisible({ timeout: T });
    // The chat's header says who answers and in which mode.
    await expect(page.locator('#chat-agent')).toHaveText('Agent: api · Run mode');
    check(/\/chat/.test(page.url()), `not on a chat page: ${page.url()}`);
    // Untitled until its first message.
    await expect(page.locator('#chat-title')).toHaveText('New chat');
    for (const tab of ['Local CLI connection', 'Costs', 'Models']) {
      await expect(page.getByRole('tab', { name: tab })).toBeVisible();
    }
  },
  async 'streamed-tool'() {
    await need('streamed-tool');
    const before = await page.locator('li.tool').count();
    await send('what does server.txt say?');
    await expect(lastAnswer()).toContainText('The file says: server file', { timeout: T });
    const tools = page.locator('li.tool');
    await expect(tools).toHaveCount(before + 1);
    const line = await tools.last().locator('summary').textContent();
    check(line.startsWith('✓') && line.includes('read_file'), `the tool call's line: ${line}`);
    check(!(await tools.last().locator('details').evaluate((d) => d.open)), 'the tool call is not folded');
    // The first message titles the chat (issue 43, item 9).
    await expect(page.locator('#chat-title')).toHaveText('what does server.txt say?', { timeout: T });
    check(await page.title() === 'what does server.txt say? · agentworks', `the window's title: ${await page.title()}`);
  },
  async attachments() {
    await expect(composer()).toContainText('go to the server and the model');
    await need('attachments');
    const chooser = page.waitForEvent('filechooser');
    await page.getByRole('button', { name: 'Attach files' }).click();
    await (await chooser).setFiles([config.image, config.text_file]);
    await expect(page.getByRole('list', { name: 'Attached files' }).getByRole('listitem')).toHaveCount(2);
    await send('what is in these?');
    await expect(lastAnswer()).toContainText('a one-pixel image', { timeout: T });
    await need('check-attachments');
  },
  async 'script-as-text'() {
    await need('script-as-text');
    await send('say something dangerous');
    const answer = lastAnswer();
    await expect(answer).toContainText('<script>alert(1)</script>', { timeout: T });
    check((await page.getByRole('list', { name: 'Conversation' }).locator('script').count()) === 0, 'a script element in the conversation');
    await page.waitForTimeout(300);
    check(dialogs === 0, 'a dialog fired');
  },
  async stop() {
    await need('stop');
    await send('take your time');
    const stop = page.getByRole('button', { name: 'Stop' });
    await expect(stop).toBeEnabled({ timeout: T });
    await stop.click();
    await expect(page.getByText('Stopped: the turn was cancelled.').last()).toBeVisible({ timeout: T });
  },
  async 'local-cli'() {
    await page.getByRole('tab', { name: 'Local CLI connection' }).click();
    const setup = page.getByRole('heading', { name: 'Set up the CLI on your computer' });
    const setupAgain = page.getByRole('button', { name: 'Set up another computer' });
    await expect(setup).toBeVisible();
    // The setup step shows the server's install line exactly as GET /v1/cli gives it.
    const manifest = await (await page.request.get(`${base}/v1/cli`)).json();
    check(manifest.binaries.length > 0, `the server offers no CLI: ${JSON.stringify(manifest)}`);
    for (const binary of manifest.binaries) {
      await expect(page.locator(`code.install-command[data-arch="${binary.arch}"]`)).toHaveText(binary.install, { timeout: T });
    }
    await expect(page.locator('#cli-platforms')).toContainText(`This server offers the CLI for Linux ${manifest.binaries[0].arch}`);
    const folder = page.getByLabel(/^repo \(writable\)/);
    await expect(folder).toBeVisible({ timeout: T });
    await folder.check();
    await expect(page.getByRole('heading', { name: 'Review before using repo on laptop' })).toBeVisible();
    await expect(page.getByText('Commands the agent runs can reach the network')).toBeVisible();
    await page.getByRole('button', { name: 'Use this folder' }).click();
    await expect(page.getByText('This chat uses the folder')).toBeVisible({ timeout: T });
    // Bound, the setup steps give way to a button that brings them back (issue 43, item 9).
    await expect(setup).toBeHidden();
    await expect(page.getByRole('textbox', { name: 'Folder to share' })).toBeHidden();
    await setupAgain.click();
    await expect(setup).toBeVisible();
    await expect(setupAgain).toBeHidden();
    await page.reload();
    await page.getByRole('tab', { name: 'Local CLI connection' }).click();
    await expect(page.getByText('This chat uses the folder')).toBeVisible({ timeout: T });
    await expect(setupAgain).toBeVisible();
    await expect(setup).toBeHidden();
    await need('local-cli');
    await send('make a file on my laptop');
    // The model's answer is held back: the turn runs, and the connection cannot change.
    await expect(page.getByRole('button', { name: 'Stop' })).toBeEnabled({ timeout: T });
    await expect(page.getByRole('button', { name: 'Disconnect' })).toBeDisabled();
    await expect(page.getByText('A turn is running: connection changes wait until it ends.')).toBeVisible();
    await expect(lastAnswer()).toContainText('made it', { timeout: T });
    const line = await page.locator('li.tool').last().locator('summary').textContent();
    check(line.includes('✓'), `the laptop command's line: ${line}`);
    await need('check-laptop-file');
    await page.getByRole('button', { name: 'Disconnect' }).click();
    await page.getByRole('button', { name: 'Switch to server files' }).click();
    await expect(page.getByText('This chat uses server files.')).toBeVisible({ timeout: T });
    await expect(setup).toBeVisible();
  },
  async 'executor-offline'() {
    // Bound again, then the executor stops: the device shows offline and the chat keeps its
    // binding, saying so.
    await page.getByLabel(/^repo \(writable\)/).check();
    await page.getByRole('button', { name: 'Use this folder' }).click();
    await expect(page.getByText('This chat uses the folder')).toBeVisible({ timeout: T });
    const legend = page.locator('fieldset.device legend').filter({ hasText: 'laptop' });
    await expect(legend).toContainText('online', { timeout: T });
    await need('stop-executor');
    await expect(legend).toContainText('offline', { timeout: T });
    await expect(page.getByText('laptop is offline. The chat keeps this binding').first()).toBeVisible({ timeout: T });
    await expect(page.getByRole('button', { name: 'Disconnect' })).toBeEnabled();
    // Reopened, the chat shows its earlier turns, tool lines included, and still its binding.
    await page.reload();
    const conversation = page.getByRole('list', { name: 'Conversation' });
    await expect(conversation).toContainText('what does server.txt say?', { timeout: T });
    await expect(conversation).toContainText('The file says: server file');
    await expect(conversation).toContainText('✓ execute_shell_command exit 0');
    await expect(page.getByText('laptop is offline. The chat keeps this binding').first()).toBeVisible({ timeout: T });
  },
  async 'chat-title'() {
    // The chat keeps the title its first message gave it, in the list and on its page, after
    // later turns; the list shows no timestamp as a chat's name (issue 43, item 9).
    await page.goto(`${base}/console/`);
    const chats = page.getByRole('list', { name: 'Chats in app' });
    const link = chats.getByRole('link', { name: 'what does server.txt say?', exact: true });
    await expect(link).toBeVisible({ timeout: T });
    check(!(await chats.getByRole('link').allTextContents()).some((t) => t.startsWith('Chat of')), 'a chat is named by its time');
    await link.click();
    await expect(page.locator('#chat-title')).toHaveText('what does server.txt say?', { timeout: T });
    await expect(page.getByRole('list', { name: 'Conversation' })).toContainText('make a file on my laptop');
  },
  async 'cli-chat'() {
    // A coding CLI as the agent (issue 45): the real runnerd starts now, with the real Codex
    // against a scripted model. Turn 1 reads a file through project/ and patches another
    // through the bridge; turn 2 resumes the thread; turn 3's command is stopped.
    const CLI = 90000; // Codex starts a process per turn
    await need('start-runnerd');
    await page.goto(`${base}/console/`);
    await page.getByRole('button', { name: 'New chat' }).first().click();
    const form = page.getByRole('form', { name: /^New chat in / }).first();
    const agent = form.getByLabel('Agent', { exact: true });
    await expect(agent.locator('option[value="codex"]')).toHaveCount(1, { timeout: T });
    check(await agent.locator('option[value="ghost"]').isDisabled(), 'the unavailable provider can be picked');
    await agent.selectOption('codex');
    await form.getByLabel('Mode', { exact: true }).selectOption('builder');
    await form.getByRole('button', { name: 'Start chat' }).click();
    await expect(page.locator('#chat-agent')).toHaveText('Agent: codex · Builder mode (writes the project)', { timeout: T });
    // The Local CLI connection panel is the same whatever the agent: a CLI chat binds too.
    await expect(page.getByRole('heading', { name: 'Your devices' })).toBeVisible({ timeout: T });
    await page.getByRole('tab', { name: 'Models' }).click();
    await expect(page.locator('#tabpanel-models')).toContainText('is a coding CLI that runnerd runs with the model scripted', { timeout: T });
    await page.getByRole('tab', { name: 'Local CLI connection' }).click();

    await send('Read server.txt and fix plan.txt.');
    await expect(lastAnswer()).toContainText('server.txt says server file; plan.txt now says shipped.', { timeout: CLI });
    // Folded lines, each done: the command (Codex's `shell`) and agentd's bridge patch (Codex
    // also reports its own MCP call, `bridge.diff_patch_workspace_file`, a line of its own).
    const tools = page.locator('li.tool');
    const lines = await tools.locator('summary').allTextContents();
    check(lines.length >= 2 && lines.every((l) => l.startsWith('✓ ')), `the tool lines: ${JSON.stringify(lines)}`);
    check(lines[0] === '✓ shell exit 0', `the command's line: ${lines[0]}`);
    check(lines.includes('✓ diff_patch_workspace_file patched plan.txt'), `no bridge patch line: ${JSON.stringify(lines)}`);
    check(!(await tools.locator('details').evaluateAll((all) => all.some((d) => d.open))), 'a tool call is not folded');
    const shown = await tools.first().locator('pre.details').textContent();
    check(shown.includes('cat project/server.txt') && shown.includes('server file'), `the command's details: ${shown}`);
    await need('check-cli-patch');
    await expect(page.getByRole('button', { name: 'Send' })).toBeEnabled({ timeout: T });

    await send('And now?');
    await expect(lastAnswer()).toContainText('Still the same thread.', { timeout: CLI });
    await need('check-cli-resume');
    await expect(page.getByRole('button', { name: 'Send' })).toBeEnabled({ timeout: T });

    await send('Wait a while.');
    await need('wait-cli-sleep');
    await expect(tools.last().locator('summary')).toHaveText('… shell running');
    await page.getByRole('button', { name: 'Stop' }).click();
    await expect(page.getByText('Stopped: the turn was cancelled.')).toBeVisible({ timeout: T });
    await need('check-cli-sleep-gone');
    await expect(page.getByRole('button', { name: 'Send' })).toBeEnabled({ timeout: T });
    // Reopened, the chat shows its turns and folded tool lines as stored.
    await page.reload();
    const conversation = page.getByRole('list', { name: 'Conversation' });
    await expect(conversation).toContainText('plan.txt now says shipped.', { timeout: T });
    await expect(conversation).toContainText('✓ diff_patch_workspace_file');
    await expect(conversation).toContainText('Still the same thread.');
    await expect(conversation).toContainText('✗ shell the turn ended before this call did');
  },
  async 'cli-laptop'() {
    // A coding CLI on the server with its hands on the laptop (issue 46): a Claude Code chat
    // bound to the laptop folder with Use this folder; the scripted model asks the bridge for a
    // command, which runs in the laptop folder; then the chat switches to server files.
    const CLI = 90000;
    await need('start-executor');
    await page.goto(`${base}/console/`);
    await page.getByRole('button', { name: 'New chat' }).first().click();
    const form = page.getByRole('form', { name: /^New chat in / }).first();
    const agent = form.getByLabel('Agent', { exact: true });
    await expect(agent.locator('option[value="claude"]')).toHaveCount(1, { timeout: T });
    await agent.selectOption('claude');
    await form.getByRole('button', { name: 'Start chat' }).click();
    await expect(page.locator('#chat-agent')).toHaveText('Agent: claude · Run mode', { timeout: T });
    await page.getByRole('tab', { name: 'Local CLI connection' }).click();
    const legend = page.locator('fieldset.device legend').filter({ hasText: 'laptop' });
    await expect(legend).toContainText('online', { timeout: T });
    await page.getByLabel(/^repo \(writable\)/).check();
    await expect(page.getByRole('heading', { name: 'Review before using repo on laptop' })).toBeVisible();
    await page.getByRole('button', { name: 'Use this folder' }).click();
    await expect(page.getByText('This chat uses the folder')).toBeVisible({ timeout: T });

    await send('Make a file in my folder.');
    await expect(lastAnswer()).toContainText('Claude made the file on your laptop.', { timeout: CLI });
    // One folded line: the bridge's command, run on the laptop by agentd through the executor
    // (Claude Code's own report of the call is not shown a second time).
    const tools = page.locator('li.tool');
    const lines = await tools.locator('summary').allTextContents();
    check(JSON.stringify(lines) === '["✓ execute_shell_command exit 0"]', `the tool lines: ${JSON.stringify(lines)}`);
    check(!(await tools.locator('details').evaluate((d) => d.open)), 'the tool call is not folded');
    const shown = await tools.first().locator('pre.details').textContent();
    check(shown.includes('claude-made.txt'), `the command's details: ${shown}`);
    await need('check-cli-laptop');
    // The turn over, bound, with the call in the conversation: a screenshot of its own (the
    // scenario's ends on server files).
    await expect(page.getByRole('button', { name: 'Send' })).toBeEnabled({ timeout: T });
    await expect(page.getByRole('button', { name: 'Disconnect' })).toBeEnabled({ timeout: T });
    await page.screenshot({ path: join(shots, 'cli-laptop-bound.png'), fullPage: true });
    await page.getByRole('button', { name: 'Disconnect' }).click();
    await page.getByRole('button', { name: 'Switch to server files' }).click();
    await expect(page.getByText('This chat uses server files.')).toBeVisible({ timeout: T });
    await expect(page.getByText('This chat uses the folder')).toBeHidden();
  },
  async 'device-approve'() {
    const started = await page.request.post(`${base}/v1/device/code`, { data: { device_name: 'browser-laptop' } });
    check(started.status() === 200, `POST /v1/device/code answered ${started.status()}`);
    const code = await started.json();
    // Not signed in: the page sends the person to sign in, and back.
    const stranger = await browser.newContext();
    const other = await stranger.newPage();
    await other.goto(`${base}/v1/device/approve?user_code=${encodeURIComponent(code.user_code)}`);
    await expect(other.getByLabel('Username', { exact: true })).toBeVisible({ timeout: T });
    check(other.url().includes('next='), `no way back after sign-in: ${other.url()}`);
    await stranger.close();
    await page.goto(`${base}/v1/device/approve?user_code=${encodeURIComponent(code.user_code)}`);
    await expect(page.getByText(code.user_code)).toBeVisible({ timeout: T });
    await expect(page.getByText('browser-laptop').first()).toBeVisible();
    // The device and the code side by side, each as `agentworks login` prints it, to compare
    // with the terminal (issue 42, item 2).
    const shownName = page.locator('#compare #device-name');
    const shownCode = page.locator('#compare #device-code');
    await expect(shownName).toHaveText('Device: browser-laptop');
    await expect(shownCode).toHaveText(`Code: ${code.user_code}`);
    const [nameBox, codeBox] = [await shownName.boundingBox(), await shownCode.boundingBox()];
    check(nameBox && codeBox && Math.abs(nameBox.y - codeBox.y) < 2 && nameBox.x + nameBox.width <= codeBox.x,
      `the device and the code are not side by side: ${JSON.stringify([nameBox, codeBox])}`);
    // A name that could reorder what the page shows is refused when the login starts.
    const spoofed = await page.request.post(`${base}/v1/device/code`, { data: { device_name: 'laptop\u202eKJHG-FDCB' } });
    check(spoofed.status() === 400, `a device name with U+202E answered ${spoofed.status()}`);
    await expect(page.getByText('devices:connect').first()).toBeVisible();
    await expect(page.getByRole('button', { name: 'Deny' })).toBeVisible();
    // Denied: the page says so, no longer asks, and leads back (issue 43, item 9). A second
    // login of its own, so the first is still pending for Approve below.
    const second = await page.request.post(`${base}/v1/device/code`, { data: { device_name: 'not-mine' } });
    const denied = await second.json();
    await page.goto(`${base}/v1/device/approve?user_code=${encodeURIComponent(denied.user_code)}`);
    await expect(page.locator('#compare #device-name')).toHaveText('Device: not-mine', { timeout: T });
    await page.getByRole('button', { name: 'Deny' }).click();
    await expect(page.getByRole('heading', { name: 'Device login denied' })).toBeVisible({ timeout: T });
    await expect(page.locator('#outcome')).toContainText('not-mine was not given access');
    await expect(page.getByRole('heading', { name: 'Approve a device login' })).toBeHidden();
    await expect(page.getByRole('button', { name: 'Approve' })).toBeHidden();
    await expect(page.getByText('The code expires in')).toBeHidden();
    await page.getByRole('link', { name: 'Back to the console' }).click();
    await expect(page.getByRole('heading', { name: 'Your projects' })).toBeVisible({ timeout: T });
    const refusedToken = await page.request.post(`${base}/v1/device/token`, {
      form: { grant_type: 'urn:ietf:params:oauth:grant-type:device_code', device_code: denied.device_code },
    });
    check((await refusedToken.json()).error === 'access_denied', 'the denied login got a token');
    // Approved: the page says what happened and what comes next, and leads back.
    await page.goto(`${base}/v1/device/approve?user_code=${encodeURIComponent(code.user_code)}`);
    await expect(page.locator('#compare #device-code')).toHaveText(`Code: ${code.user_code}`, { timeout: T });
    await page.getByRole('button', { name: 'Approve' }).click();
    await expect(page.getByRole('status').filter({ hasText: 'Approved:' }))
      .toHaveText(`Approved: browser-laptop can now connect as ${config.username}.`, { timeout: T });
    await expect(page.getByRole('heading', { name: 'Device login approved' })).toBeVisible();
    await expect(page.locator('#outcome')).toContainText('agentworks login');
    await expect(page.getByRole('heading', { name: 'Approve a device login' })).toBeHidden();
    await expect(page.getByText('The code expires in')).toBeHidden();
    await expect(page.getByRole('button', { name: 'Approve' })).toBeHidden();
    await expect(page.getByRole('button', { name: 'Deny' })).toBeHidden();
    await expect(page.getByRole('link', { name: 'Back to the console' })).toBeVisible();
    const token = await page.request.post(`${base}/v1/device/token`, {
      form: { grant_type: 'urn:ietf:params:oauth:grant-type:device_code', device_code: code.device_code },
    });
    const body = await token.json();
    check(token.status() === 200 && typeof body.access_token === 'string', `POST /v1/device/token: ${token.status()} ${JSON.stringify(body)}`);
    // The page stays as it is for its screenshot; the next scenarios go back to the console.
  },
  async 'cross-origin'() {
    // Signed in (the context carries the cookie), but from another site: refused.
    const answer = await page.request.post(`${base}/v1/chats`, {
      headers: { Origin: 'http://evil.example' }, data: { project: 'app' },
    });
    check(answer.status() === 403, `a cross-origin POST answered ${answer.status()}`);
    // The attack for real: a page of another origin on the same host (so the same site, and
    // SameSite=Lax still sends the cookie) makes the browser POST a new chat and a cancel.
    const chats = async () => (await (await page.request.get(`${base}/v1/chats?project=app`)).json()).chats.length;
    const before = await chats();
    // A classic cross-site request forgery: a form that posts itself (text/plain, shaped as
    // JSON) and is navigated to, so the answer is on the page.
    const attackPage = `<!doctype html><title>attack</title>
      <form method="POST" action="${base}/v1/chats" enctype="text/plain">
      <input type="hidden" name='{"project":"app","x":"' value='"}'></form>
      <script>document.forms[0].submit();</script>`;
    const attacker = createServer((_, res) => { res.setHeader('content-type', 'text/html'); res.end(attackPage); });
    await new Promise((resolve) => attacker.listen(0, '127.0.0.1', resolve));
    try {
      const evil = await context.newPage();
      const posted = evil.waitForResponse((r) => r.url() === `${base}/v1/chats` && r.request().method() === 'POST', { timeout: T });
      await evil.goto(`http://127.0.0.1:${attacker.address().port}/`);
      const response = await posted;
      await evil.waitForLoadState();
      // 403 csrf_refused (not 401 not_signed_in) shows the cookie went with it: only the
      // Origin check stood between the attacker and a new chat.
      const refused = await evil.textContent('body');
      check(response.status() === 403 && refused.includes('csrf_refused'), `the attacker page's POST answered ${response.status()} ${refused}`);
      await evil.close();
    } finally {
      attacker.close();
    }
    const after = await chats();
    check(after === before, `the attack made a chat: ${before} before, ${after} after`);
  },
  async connections() {
    await page.goto(`${base}/console/`);
    await page.getByRole('link', { name: 'MCP connections and secrets' }).first().click();
    await expect(page.getByRole('heading', { name: 'app settings' })).toBeVisible({ timeout: T });
    const form = page.getByRole('form', { name: 'Add an MCP connection' });
    await form.getByLabel('Name', { exact: true }).fill('Linear');
    await form.getByLabel('Server URL', { exact: true }).fill('https://mcp.linear.example/mcp?workspace=k-123');
    await form.getByLabel('Header (optional)', { exact: true }).fill('Authorization');
    await form.getByLabel('Secret the header sends', { exact: true }).fill('LINEAR_API_KEY');
    await form.getByRole('button', { name: 'Add connection' }).click();
    const list = page.getByRole('list', { name: 'MCP connections' });
    await expect(list.getByRole('heading', { name: 'Linear' })).toBeVisible({ timeout: T });
    await expect(list).toContainText('https://mcp.linear.example/mcp');
    await expect(list).toContainText('«secret LINEAR_API_KEY»');
    check(!(await list.textContent()).includes('k-123'), 'the query string is shown');
    // A loopback server is refused, and the page says why.
    const again = page.getByRole('form', { name: 'Add an MCP connection' });
    await again.getByLabel('Name', { exact: true }).fill('Local');
    await again.getByLabel('Server URL', { exact: true }).fill('https://127.0.0.1/mcp');
    await again.getByRole('button', { name: 'Add connection' }).click();
    await expect(again.getByRole('alert')).toContainText('loopback', { timeout: T });
    // A secret: its name listed, its value never on the page again.
    const secret = page.getByRole('form', { name: 'Set a project secret' });
    await secret.getByLabel('Secret name', { exact: true }).fill('LINEAR_API_KEY');
    await secret.getByLabel('Secret value', { exact: true }).fill('lin_api_browser-typed-0451');
    await secret.getByRole('button', { name: 'Save secret' }).click();
    await expect(page.getByRole('list', { name: 'Project secrets' })).toContainText('LINEAR_API_KEY', { timeout: T });
    const shown = await page.evaluate(() => document.body.innerText + [...document.querySelectorAll('input')].map((i) => i.value).join(' '));
    check(!shown.includes('lin_api_browser-typed-0451'), 'the secret value is still on the page');
    await page.getByRole('button', { name: 'Remove Linear' }).click();
    await expect(page.getByRole('list', { name: 'MCP connections' })).toContainText('No MCP connections.', { timeout: T });
  },
  async 'reused-sign-in-link'() {
    // The link the operator made (`agentworksctl user sign-in-link`) signs in once.
    const fresh = await browser.newContext();
    const first = await fresh.newPage();
    await first.goto(config.sign_in_link);
    await expect(first.getByText(`Signed in as ${config.username}`)).toBeVisible({ timeout: T });
    await fresh.close();
    // Opened again, it says it was used or expired and how to get a new one, and the password
    // form is a choice, not the answer (issue 43, item 9).
    await page.goto(config.sign_in_link);
    await expect(page.getByRole('heading', { name: 'This sign-in link no longer works' })).toBeVisible({ timeout: T });
    await expect(page.getByRole('alert')).toContainText('used already or has expired');
    await expect(page.locator('#new-link-command')).toHaveText('agentworksctl user sign-in-link YOUR-USER-NAME');
    await expect(page.getByLabel('Password', { exact: true })).toBeHidden();
    check(!page.url().includes('code='), `the used code stays in the address bar: ${page.url()}`);
    const password = page.getByRole('link', { name: 'Sign in with a password instead' });
    check(await password.getAttribute('href') === '/console/sign-in', 'no way to the password form');
  },
  async 'sign-out-replay'() {
    await page.goto(`${base}/console/`);
    const cookies = await context.cookies(base);
    const session = cookies.find((c) => c.name === 'aw_session');
    check(session, `no session cookie: ${JSON.stringify(cookies.map((c) => c.name))}`);
    const before = await page.request.get(`${base}/v1/projects`);
    check(before.status() === 200, `the signed-in cookie answered ${before.status()}`);
    await page.getByRole('button', { name: 'Sign out' }).click();
    await expect(page.getByRole('button', { name: 'Sign in' })).toBeVisible({ timeout: T });
    const replay = await browser.newContext({ extraHTTPHeaders: { Cookie: `aw_session=${session.value}` } });
    const after = await replay.request.get(`${base}/v1/projects`);
    await replay.close();
    check(after.status() === 401, `the replayed cookie answered ${after.status()}`);
  },
};

let failed = false;
for (const name of config.scenarios) {
  const started = Date.now();
  let error = null;
  try {
    check(scenarios[name], `no scenario ${name}`);
    await scenarios[name]();
  } catch (e) {
    error = String(e && e.message ? e.message : e).split('\n').slice(0, 6).join(' | ');
  }
  const screenshot = join(shots, `${name}.png`);
  try { await page.screenshot({ path: screenshot, fullPage: true }); } catch (e) { error = error || `screenshot: ${e.message}`; }
  process.stdout.write(`${JSON.stringify({ scenario: name, ok: error === null, error, screenshot, ms: Date.now() - started })}\n`);
  if (error) { failed = true; break; }
}
await browser.close();
stdin.close();
process.exit(failed ? 1 : 0);
