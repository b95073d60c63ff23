// Drive Debian's chromium (headless, no browser download) through the admin with playwright-core.
// stdin: {base, user, password, userDataDir, shots, visits: [{name, path, width, probe, click, shot}]}
// stdout: {visits: {name: what the probe read from the DOM}, failedRequests: [...]}
// Run by tests/helpers/browser.py, which installs playwright-core and reads the result.
"use strict";

const { chromium } = require("playwright-core");

const FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-first-run",
];

// Probes run in the page. Each returns plain JSON.
const PROBES = {
  list: () => {
    const table = document.querySelector("#result_list");
    const container = table.closest(".results") || table.parentElement;
    const cells = [...table.querySelectorAll("th, td")];
    return {
      tableWidth: table.getBoundingClientRect().width,
      tableRight: table.getBoundingClientRect().right,
      containerWidth: container.clientWidth,
      containerScroll: container.scrollWidth - container.clientWidth,
      pageOverflow: document.documentElement.scrollWidth - window.innerWidth,
      viewport: window.innerWidth,
      clippedCells: cells
        .filter((c) => c.scrollWidth > c.clientWidth + 1)
        .map((c) => `${c.className}: ${c.textContent.trim().slice(0, 60)}`),
      headers: [...table.querySelectorAll("thead th")].map((th) => th.textContent.trim()),
      rows: [...table.querySelectorAll("tbody tr")].map((tr) =>
        Object.fromEntries(
          [...tr.children].map((td) => [(td.className.match(/field-(\w+)/) || [, "other"])[1], td.textContent.trim()]),
        ),
      ),
      rowHeights: [...table.querySelectorAll("tbody tr")].map((tr) => tr.getBoundingClientRect().height),
      dashboard: document.querySelector("#evaluation-dashboard")?.innerText ?? null,
      siteLink: document.querySelector("#user-tools a[href='/api/docs']")?.textContent ?? null,
    };
  },
  detail: () => {
    const log = document.getElementById("te-log");
    const rows = {};
    for (const row of document.querySelectorAll(".form-row")) {
      const label = row.querySelector("label");
      const value = row.querySelector(".readonly");
      if (label && value) rows[label.textContent.replace(/:$/, "").trim()] = value.innerText.trim();
    }
    return {
      log: log && {
        scrollTop: log.scrollTop,
        scrollHeight: log.scrollHeight,
        clientHeight: log.clientHeight,
        text: log.textContent,
      },
      logSource: document.getElementById("te-log-source")?.dataset.source ?? null,
      logCaption: document.getElementById("te-log-source")?.innerText ?? null,
      preChars: [...document.querySelectorAll("pre")].reduce((n, pre) => n + pre.textContent.length, 0),
      htmlChars: document.documentElement.outerHTML.length,
      pageOverflow: document.documentElement.scrollWidth - window.innerWidth,
      headings: [...document.querySelectorAll("h2")].map((h) => h.textContent.trim()),
      inlineCaptions: [...document.querySelectorAll(".inline-group td.original p")].map((p) => p.textContent.trim()),
      inlineEmpty: [...document.querySelectorAll(".te-inline-empty")].map(
        (p) => p.closest(".inline-group").querySelector("h2").textContent.trim(),
      ),
      execs: [...document.querySelectorAll("#execs-group tbody tr")].map((tr) =>
        Object.fromEntries(
          [...tr.children].map((td) => [(td.className.match(/field-(\w+)/) || [, "other"])[1], td.innerText.trim()]),
        ),
      ),
      tests: [...document.querySelectorAll("#test_results-group tbody tr")].map((tr) =>
        Object.fromEntries(
          [...tr.children].map((td) => [(td.className.match(/field-(\w+)/) || [, "other"])[1], td.innerText.trim()]),
        ),
      ),
      booleanIcons: [...document.querySelectorAll("img[src*='icon-no'], img[src*='icon-yes']")].length,
      fields: rows,
      buttons: [...document.querySelectorAll(".object-tools button, .object-tools a")].map((b) => b.textContent.trim()),
    };
  },
  text: () => ({ text: document.body.innerText, title: document.title }),
};

async function main() {
  const plan = JSON.parse(require("fs").readFileSync(0, "utf8"));
  const context = await chromium.launchPersistentContext(plan.userDataDir, {
    executablePath: plan.executable || "/usr/bin/chromium",
    headless: true,
    args: FLAGS,
    viewport: { width: 1400, height: 900 },
  });
  const failedRequests = [];
  const out = { visits: {}, failedRequests };
  try {
    const page = context.pages()[0] || (await context.newPage());
    page.on("response", (response) => {
      if (response.status() >= 400) failedRequests.push(`${response.status()} ${response.url()}`);
    });
    await page.goto(`${plan.base}/admin/login/?next=/admin/`);
    await page.fill("#id_username", plan.user);
    await page.fill("#id_password", plan.password);
    await Promise.all([page.waitForNavigation(), page.click("input[type=submit]")]);
    for (const visit of plan.visits) {
      await page.setViewportSize({ width: visit.width || 1400, height: 900 });
      if (visit.path) await page.goto(`${plan.base}${visit.path}`, { waitUntil: "load" });
      if (visit.click) {
        await Promise.all([page.waitForNavigation({ waitUntil: "load" }), page.click(visit.click)]);
      }
      const result = PROBES[visit.probe || "text"] ? await page.evaluate(PROBES[visit.probe || "text"]) : {};
      result.url = page.url();
      if (visit.shot) {
        await page.screenshot({ path: `${plan.shots}/${visit.name}.png`, fullPage: visit.shot === "full" });
        if (visit.shot === "full") {
          // A tall page also in screen-sized parts, readable one at a time.
          const height = await page.evaluate(() => document.documentElement.scrollHeight);
          const width = visit.width || 1400;
          for (let i = 0, y = 0; y < height && i < 8; i += 1, y += 900) {
            const clip = { x: 0, y, width, height: Math.min(900, height - y) };
            await page.screenshot({ path: `${plan.shots}/${visit.name}-part${i}.png`, fullPage: true, clip });
          }
        }
        if (visit.probe === "detail" && (await page.$("#te-log"))) {
          await page.locator("#te-log").screenshot({ path: `${plan.shots}/${visit.name}-log.png` });
        }
      }
      out.visits[visit.name] = result;
    }
  } finally {
    await context.close();
  }
  process.stdout.write(JSON.stringify(out));
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err) + "\n");
  process.exit(1);
});
