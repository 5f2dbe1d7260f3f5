// Run by display_test.go: logs in as alice and, for each call it is given,
// fails when the page draws args that read as other args without saying
// so: the canonical JSON and a value are drawn (screenshots compared) as
// the args they look like, or a warning is missing.
//
// Usage: node display.mjs '{"chromium": PATH, "url": URL, "token": T, "calls": [{
//   "key",
//   "looksLike": the JSON the canonical args read as (optional),
//   "toLooksLike": the literal the "to" value reads as (optional),
//   "raw": the raw canonical args, behind the "raw bytes" toggle (optional),
//   "warnings": selectors of the warnings the card shows,
//   "flagged": the paths of the values marked}]}'

import { chromium } from 'playwright-core';

const cfg = JSON.parse(process.argv[2]);
const browser = await chromium.launch({ executablePath: cfg.chromium, headless: true });
let failed = false;
const fail = (what) => { failed = true; console.log('FAIL: ' + what); };

// drawnAs reports whether the element is drawn pixel for pixel as text.
async function drawnAs(locator, text) {
  const drawn = await locator.screenshot();
  await locator.evaluate((e, t) => { e.dataset.real = e.textContent; e.textContent = t; }, text);
  const lookalike = await locator.screenshot();
  await locator.evaluate((e) => { e.textContent = e.dataset.real; });
  return Buffer.compare(drawn, lookalike) === 0;
}

try {
  const page = await browser.newPage();
  page.setDefaultTimeout(30_000);
  await page.goto(cfg.url);
  await page.locator('#login').waitFor({ state: 'visible' });
  await page.fill('#token', cfg.token);
  await page.click('#login-submit');
  for (const c of cfg.calls) {
    const card = page.locator(`article.call[data-key="${c.key}"]`);
    await card.waitFor();
    const canonical = card.locator('pre.canonical');
    console.log(`${c.key}: the canonical JSON is ${JSON.stringify(await canonical.textContent())}`);
    if (c.looksLike && await drawnAs(canonical, c.looksLike)) {
      fail(`${c.key}: the canonical JSON is drawn pixel for pixel as ${c.looksLike}`);
    }
    if (c.toLooksLike && await drawnAs(card.locator('tr[data-path="to"] td'), c.toLooksLike)) {
      fail(`${c.key}: the value of "to" is drawn pixel for pixel as ${c.toLooksLike}`);
    }
    if (c.raw !== undefined && (await card.locator('details.raw pre.raw').textContent()) !== c.raw) {
      fail(`${c.key}: the raw bytes are not behind their toggle`);
    }
    for (const w of ['.hidden-chars', '.lookalikes']) {
      const shown = (await card.locator(w).count()) > 0;
      if (shown !== c.warnings.includes(w)) fail(`${c.key}: warning ${w} shown: ${shown}`);
      if (shown) console.log(`${c.key}: ${w}: ${await card.locator(w).textContent()}`);
    }
    const marked = await card.locator('table.fields tr.hidden, table.fields tr.lookalike')
      .evaluateAll((rows) => rows.map((r) => r.dataset.path));
    if (JSON.stringify(marked) !== JSON.stringify(c.flagged)) fail(`${c.key}: rows marked ${JSON.stringify(marked)}, want ${JSON.stringify(c.flagged)}`);
  }
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
