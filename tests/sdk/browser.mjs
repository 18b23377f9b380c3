// The web app in headless Chromium (Debian's), driven by playwright-core, as a
// newcomer uses it: sign up, follow the mailed link, mint a key and call a model
// with the official openai SDK, try the playground, connect an own provider
// account, reorder the model's waterfall, look at every page, revoke the key,
// sign out. Run by tests/browser.rs, which owns the SMTP sink: when this script
// needs a mailed link it prints {"need": "link", ...} and reads the link on stdin.
//
// Env: SLUICE_WEB, SLUICE_BASE_URL (the gateway), MOCK_BASE, SHOTS (screenshot
// folder), EMAIL, CHROMIUM (default /usr/bin/chromium).

import { chromium } from "playwright-core";
import OpenAI from "openai";
import { createInterface } from "node:readline";
import { mkdirSync } from "node:fs";

const web = process.env.SLUICE_WEB;
const gateway = process.env.SLUICE_BASE_URL;
const shots = process.env.SHOTS;
const email = process.env.EMAIL;
mkdirSync(shots, { recursive: true });

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function mailedLink(seen) {
  console.log(JSON.stringify({ need: "link", to: email, seen }));
  const { value } = await lines.next();
  return value.trim();
}

function check(ok, what) {
  if (!ok) throw new Error(`check failed: ${what}`);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
let failed = null;
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  page.on("dialog", (d) => d.accept());
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("console", (m) => {
    if (m.type() === "error") errors.push(m.text());
  });
  const shot = async (name) => page.screenshot({ path: `${shots}/${name}.png`, fullPage: true });

  // The landing page: the catalog and the signup form.
  await page.goto(`${web}/`);
  await shot("landing");
  await page.fill("#landing-email", email);
  await page.click("form.signup-card button[type=submit]");
  await page.waitForSelector("text=Check your inbox");
  const signupKey = (await page.textContent("#new-key")).trim();
  check(/^xpl_[0-9a-f]{40}$/.test(signupKey), "the signup shows its key");
  await shot("signup");

  // The mailed link signs in and verifies the address.
  await page.goto(await mailedLink(0));
  check(page.url().includes("/overview"), `the link opens the overview (${page.url()})`);
  await page.waitForSelector("text=Your email address is verified");
  await shot("overview-new");

  // A key, minted in the browser, shown once.
  await page.click("nav.side >> text=API keys");
  await page.fill("#name", "browser key");
  await page.fill("#daily_spend_cap_usd", "3");
  await page.click("text=Create key");
  const key = (await page.textContent("#new-key")).trim();
  check(/^xpl_[0-9a-f]{40}$/.test(key) && key !== signupKey, "a new key");
  await shot("keys-minted");

  // The official SDK with only the base URL and the key.
  const client = new OpenAI({ baseURL: `${gateway}/v1`, apiKey: key, maxRetries: 0 });
  const r = await client.chat.completions.create({
    model: "b-shared",
    messages: [{ role: "user", content: "Hello from the browser test" }],
  });
  check(r.choices[0].message.content === "Hello from mock o1.", JSON.stringify(r));

  // The playground: a first answered call without leaving the browser.
  await page.click("nav.side >> text=Playground");
  await page.fill("#api_key", key);
  await page.selectOption("#model", "b-shared");
  await page.fill("#message", "Say hello");
  await page.click("#playground button[type=submit]");
  await page.waitForSelector("#reply");
  check((await page.textContent("#reply")).includes("Hello from mock o1."), "the playground answers");
  check(!(await page.content()).includes(key), "the key is not on the page");
  await shot("playground");

  // An own provider account.
  await page.click("nav.side >> text=Connections");
  await page.selectOption("#provider", "openai");
  await page.fill("#setup_alias", "mine");
  await page.fill("#secret", "sk-browser-own-key");
  await page.fill("#base_url", `${process.env.MOCK_BASE}/v1`);
  await page.click("text=Add account");
  await page.waitForSelector("text=The connection is saved");
  check(!(await page.content()).includes("sk-browser-own-key"), "no secret shown back");
  await shot("connections");

  // The model page: add the account's rung, move it to the top.
  await page.goto(`${web}/models/b-shared`);
  await page.selectOption("#add", { index: 0 });
  await page.click(".add-rung button");
  await page.waitForSelector("text=The waterfall is saved");
  let rungs = await page.$$eval("ol.chain > li", (lis) => lis.map((li) => li.dataset.rung));
  check(rungs.length === 3 && rungs[2].startsWith("byok:"), `added last: ${rungs}`);
  await page.click("ol.chain > li:nth-child(3) button[value='up:2']");
  await page.waitForSelector("text=The waterfall is saved");
  await page.click("ol.chain > li:nth-child(2) button[value='up:1']");
  await page.waitForSelector("text=The waterfall is saved");
  rungs = await page.$$eval("ol.chain > li", (lis) => lis.map((li) => li.dataset.rung));
  check(rungs[0].startsWith("byok:"), `moved to the top: ${rungs}`);
  await shot("model");
  // The API reads the same order, and requests follow it.
  const wf = await (await fetch(`${gateway}/api/models/b-shared/waterfall`, {
    headers: { authorization: `Bearer ${key}` },
  })).json();
  check(JSON.stringify(wf.override) === JSON.stringify(rungs), `API order ${JSON.stringify(wf)}`);
  let served = null;
  for (let i = 0; i < 50 && served !== rungs[0]; i++) {
    const a = await client.chat.completions.create({ model: "b-shared", messages: [{ role: "user", content: "hi" }] });
    served = a.provider;
    if (served !== rungs[0]) await new Promise((res) => setTimeout(res, 100));
  }
  check(served === rungs[0], `served by the account (${served})`);

  // Dragging works too: the platform rung dropped on the account's, then saved.
  await page.dragAndDrop("ol.chain > li:nth-child(2) .grip", "ol.chain > li:nth-child(1)");
  const dragged = await page.$$eval("ol.chain > li", (lis) => lis.map((li) => li.dataset.rung));
  check(dragged[0] === rungs[1] && dragged[1] === rungs[0], `dragged: ${dragged}`);
  await page.click("[data-save-order]");
  await page.waitForSelector("text=The waterfall is saved");
  const saved = await (await fetch(`${gateway}/api/models/b-shared/waterfall`, {
    headers: { authorization: `Bearer ${key}` },
  })).json();
  check(JSON.stringify(saved.override) === JSON.stringify(dragged), `saved after the drag: ${JSON.stringify(saved)}`);

  // Every other page, as a member sees it.
  await page.goto(`${web}/models?sort=input_price`);
  await shot("models");
  await page.goto(`${web}/usage`);
  await page.waitForSelector("svg.chart");
  await shot("usage");
  await page.goto(`${web}/billing`);
  await shot("billing");
  await page.goto(`${web}/settings`);
  await shot("settings");
  await page.goto(`${web}/overview`);
  await shot("overview");

  // Revoke the key: the SDK is refused from then on.
  await page.goto(`${web}/keys`);
  await page.click("tr:has-text('browser key') button:has-text('Revoke')");
  await page.waitForSelector("text=The key is revoked");
  await shot("keys-revoked");
  let refused = null;
  try {
    await client.chat.completions.create({ model: "b-shared", messages: [{ role: "user", content: "hi" }] });
  } catch (e) {
    refused = e.status;
  }
  check(refused === 401, `the revoked key is refused (${refused})`);

  // Sign out: the pages ask to sign in again.
  await page.click("text=Sign out");
  await page.goto(`${web}/overview`);
  check(page.url().endsWith("/login"), `signed out (${page.url()})`);
  check(errors.length === 0, `no script errors: ${errors.join("; ")}`);
  console.log(JSON.stringify({ done: true }));
} catch (e) {
  failed = e;
} finally {
  await browser.close();
}
if (failed) {
  console.error(failed);
  process.exit(1);
}
process.exit(0);
