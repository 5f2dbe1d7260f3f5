// The approvals inbox in a real browser: headless Chromium (the system's,
// given by path), driven by playwright-core. Run by inbox_test.go, which
// starts a consumer with --approvals-listen and publishes the calls; this
// script is the approver alice. It writes one JSON line per step on
// standard output:
//
//   {"step":"listed"}  logged in, the first call (a) shown: the test then
//                      publishes b and c and denies c over NATS
//   {"step":"done", "history": [...]}
//
// and exits non-zero, saying why on standard error, when the page does not
// do what it should.
//
// Usage: node inbox.mjs '{"chromium": PATH, "url": URL, "token": T,
//   "a": {"key", "args", "digest"}, "b": {"key", "memo", "note"}, "c": {"key"}}'

import { chromium } from 'playwright-core';

const cfg = JSON.parse(process.argv[2]);
const say = (o) => process.stdout.write(JSON.stringify(o) + '\n');

function check(ok, what) {
  if (!ok) throw new Error(what);
}

const browser = await chromium.launch({ executablePath: cfg.chromium, headless: true });
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(30_000);
  // Whatever the page should never do: run injected script, break its own
  // Content-Security-Policy, open a dialog.
  const problems = [];
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  page.on('console', (m) => {
    if (/Content Security Policy|Refused to/i.test(m.text())) problems.push('console: ' + m.text());
  });
  page.on('dialog', async (d) => {
    problems.push('dialog: ' + d.message());
    await d.dismiss();
  });
  const card = (key) => page.locator(`article.call[data-key="${key}"]`);
  const historyRow = (key) => page.locator(`#history tr[data-key="${key}"]`);

  // The login: a wrong token is refused, alice's is taken.
  await page.goto(cfg.url);
  await page.locator('#login').waitFor({ state: 'visible' });
  await page.fill('#token', 'not-a-token-of-anyone-0123456789');
  await page.click('#login-submit');
  await page.locator('#login-error', { hasText: 'no approver has this token' }).waitFor();
  await page.fill('#token', cfg.token);
  await page.click('#login-submit');
  await page.locator('#inbox').waitFor({ state: 'visible' });
  check((await page.textContent('#who-name')) === 'alice', 'logged in as ' + (await page.textContent('#who-name')));
  const cookies = await page.context().cookies();
  const session = cookies.find((c) => c.name === 'toolq_inbox');
  check(session && session.httpOnly && session.sameSite === 'Strict', 'session cookie: ' + JSON.stringify(session));

  // Call a: its tool, its exact canonical args and digest, the time left.
  const a = card(cfg.a.key);
  await a.waitFor();
  check((await a.locator('h2.tool').textContent()) === 'send_payment', 'tool of a');
  check((await a.locator('pre.canonical').textContent()) === cfg.a.args, 'canonical args of a: ' + (await a.locator('pre.canonical').textContent()));
  check((await a.locator('dd.digest').textContent()) === cfg.a.digest, 'digest of a');
  check((await a.locator('dd.key').textContent()) === cfg.a.key, 'key of a');
  check((await a.locator('tr[data-path="amount_cents"] td').textContent()) === '90000', 'amount of a');
  check(/^(59m \d\ds|1h 00m) left$/.test(await a.locator('.left').textContent()), 'time left of a: ' + (await a.locator('.left').textContent()));
  check((await a.locator('dd.waiters').textContent()).includes('and 1 more waiting'), 'waiters of a');
  say({ step: 'listed' });

  // Live: b arrives (args a model wrote to be markup), and c, decided over
  // NATS meanwhile, shows in the history, without a reload.
  const b = card(cfg.b.key);
  await b.waitFor();
  check((await b.locator('tr[data-path="memo"] td').textContent()) === JSON.stringify(cfg.b.memo), 'memo of b as text');
  check((await b.locator('tr[data-path="note"] td').textContent()) === JSON.stringify(cfg.b.note), 'note of b as text');
  check((await b.locator('pre.canonical').textContent()).includes(cfg.b.note), 'canonical args of b as text');
  check((await page.locator('img').count()) === 0, 'an img element was made');
  check((await page.locator('script').count()) === 1, 'a script element was made');
  check((await page.evaluate(() => window.__pwned)) === undefined, 'the args ran as script');
  await historyRow(cfg.c.key).locator('td.by', { hasText: 'nats-approver' }).waitFor({ state: 'attached' });
  await card(cfg.c.key).waitFor({ state: 'detached' });

  // A reason is required: the buttons wait for one.
  const approveA = a.locator('button.approve');
  check(await approveA.isDisabled(), 'approve enabled without a reason');
  await a.locator('textarea.reason').fill('   ');
  check(await approveA.isDisabled(), 'approve enabled with a blank reason');
  await a.locator('textarea.reason').fill('invoice A matches its purchase order');
  await approveA.click();
  await a.waitFor({ state: 'detached' });

  // The page's own script cannot decide without the session's CSRF token.
  const forged = await page.evaluate(async (key) => {
    const res = await fetch('api/decide', {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ key, decision: 'approve', reason: 'forged', digest: '0'.repeat(64) }),
    });
    return res.status;
  }, cfg.b.key);
  check(forged === 403, 'a decision without the CSRF token: ' + forged);

  await b.locator('textarea.reason').fill('the memo is not an invoice');
  await b.locator('button.deny').click();
  await b.waitFor({ state: 'detached' });
  check((await page.textContent('#pending-count')) === '0', 'pending count');
  await page.locator('#pending-empty').waitFor({ state: 'visible' });

  // The history: every decision, by whom and why; the approved call ran.
  await page.click('#tab-history');
  await page.locator('#history').waitFor({ state: 'visible' });
  await historyRow(cfg.a.key).locator('td.state', { hasText: 'completed' }).waitFor();
  await historyRow(cfg.b.key).locator('td.decision', { hasText: 'denied' }).waitFor();
  const history = {};
  for (const [name, key] of [['a', cfg.a.key], ['b', cfg.b.key], ['c', cfg.c.key]]) {
    const row = historyRow(key);
    history[name] = {
      decision: await row.locator('td.decision').textContent(),
      by: await row.locator('td.by').textContent(),
      reason: await row.locator('td.reason').textContent(),
      state: await row.locator('td.state').textContent(),
    };
  }
  check(problems.length === 0, problems.join('\n'));
  say({ step: 'done', history });
} finally {
  await browser.close();
}
