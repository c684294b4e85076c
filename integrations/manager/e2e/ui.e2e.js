// Manager's web UI, patched, on the operator: hack/manager-e2e.sh builds the client, starts
// Manager (MANAGER_URL, a database with no users yet) and runs this file, which drives the UI
// in a headless Chromium (MW_CHROMIUM, through playwright-core: no browser download) as its
// users would: the administrator makes a site and a kubernetes node through the forms, a
// second user runs a container. Screenshots go to MANAGER_LOGS/ui-*.png (a failed test leaves
// ui-failed-*.png and .html of both pages).
//
// Manager's rate limit (app.js: 10 per 5 minutes per address) counts every answer of 400 or
// more but 404 (the GET /api/v1/session of a page without a session, a refused form), every
// request the browser abandons (a reload or a page left while a fetch or a job's event stream
// is open) and, while they last, the requests in flight (a page load makes about eight). So:
// each user signs in once and keeps its browser context (its cookie) for every later page;
// each has an address of its own (X-Forwarded-For, which Manager trusts from its one proxy, as
// behind its nginx); and a page is left only once its requests are done (go, settle).
'use strict';

const { after, before, describe, test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { chromium } = require('playwright-core');

const { Cluster } = require('../testing/cluster');

const { MANAGER_URL, MANAGER_LOGS, MW_TEST_KUBECONFIG, MW_E2E_STORAGE_CLASS } = process.env;
const CHROMIUM = process.env.MW_CHROMIUM || '/usr/bin/chromium';
if (!MANAGER_URL || !MW_TEST_KUBECONFIG || !MANAGER_LOGS || !MW_E2E_STORAGE_CLASS) {
  console.error('run by hack/manager-e2e.sh (MANAGER_URL, MANAGER_LOGS, MW_TEST_KUBECONFIG, MW_E2E_STORAGE_CLASS)');
  process.exit(2);
}
const SHOTS = MANAGER_LOGS;
// Every wait is bounded: a step, a page, a job.
const STEP_MS = 15_000;
const JOB_MS = 120_000;

const ADMIN = { uid: 'ada', given: 'Ada', sn: 'Admin', mail: 'ada@example.org', password: 'correct-horse-battery' };
const USER = { uid: 'bob', given: 'Bob', sn: 'User', mail: 'bob@example.org', password: 'battery-staple-horse' };

async function shot(page, name) {
  await page.screenshot({ path: path.join(SHOTS, `ui-${name}.png`), fullPage: true });
}

/** Count the page's requests in flight, for settle(). */
function track(page) {
  const inflight = new Set();
  page.on('request', (r) => inflight.add(r));
  page.on('requestfinished', (r) => inflight.delete(r));
  page.on('requestfailed', (r) => inflight.delete(r));
  page.inflight = inflight;
}

/** Wait until the page has had no request in flight for half a second (a job's event stream
 * ends with its job). */
async function settle(page, timeoutMs = JOB_MS) {
  const deadline = Date.now() + timeoutMs;
  let quietSince = Date.now();
  for (;;) {
    if (page.inflight.size > 0) quietSince = Date.now();
    else if (Date.now() - quietSince >= 500) return;
    if (Date.now() > deadline) {
      throw new Error(`requests still in flight after ${timeoutMs / 1000}s: ${[...page.inflight].map((r) => r.url()).join(', ')}`);
    }
    await page.waitForTimeout(100);
  }
}

/** Leave the page once its requests are done, load `url`, and wait for its requests. */
async function go(page, url) {
  await settle(page);
  await page.goto(url);
  await settle(page);
}

/** Reload `url` until `check(page)` holds (each reload a fresh read of Manager's status). */
async function reloadUntil(page, url, what, check, timeoutMs = JOB_MS) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    await go(page, url);
    try {
      await check(page);
      return;
    } catch (err) {
      if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs / 1000}s: ${err.message}`);
    }
    await page.waitForTimeout(2000);
  }
}

/** A @mieweb/ui Select: open it by its label, pick the option. */
async function choose(page, label, option) {
  await page.getByRole('combobox', { name: label }).click();
  await page.getByRole('option', { name: option, exact: true }).click();
}

async function signIn(page, user) {
  await go(page, `${MANAGER_URL}/login`);
  await page.getByLabel('Username').fill(user.uid);
  await page.getByLabel(/^Password/).fill(user.password);
  await page.getByRole('button', { name: 'Sign in', exact: true }).click();
  await page.waitForURL((u) => !u.pathname.startsWith('/login'));
}

/** The card of one container in the list. */
const card = (page, hostname) =>
  page.locator('article').filter({ has: page.getByRole('heading', { name: hostname, exact: true }) });

describe("Manager's web UI, patched: kubernetes nodes and their containers", () => {
  const cluster = new Cluster(MW_TEST_KUBECONFIG, 't-manager-ui', { storageClass: MW_E2E_STORAGE_CLASS, capacity: '100Gi' });
  let browser;
  let admin; // the administrator's page (one context, one sign-in)
  let user; // the second user's page
  let kubeconfig;
  let siteId;

  /** A test whose failure leaves a screenshot of each page (ui-failed-<name>-<who>.png). */
  const uiTest = (name, fn) =>
    test(name, async () => {
      try {
        await fn();
      } catch (err) {
        for (const [who, page] of Object.entries({ admin, user })) {
          const base = path.join(SHOTS, `ui-failed-${name.replace(/\W+/g, '-').slice(0, 40)}-${who}`);
          await page?.screenshot({ path: `${base}.png`, fullPage: true }).catch(() => {});
          await page?.content().then((html) => fs.writeFileSync(`${base}.html`, html)).catch(() => {});
        }
        throw err;
      }
    });

  before(async () => {
    await cluster.setUp(2);
    kubeconfig = path.join(MANAGER_LOGS, 'manager-ui.kubeconfig');
    fs.writeFileSync(kubeconfig, await cluster.managerKubeconfig(), { mode: 0o600 });
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      // Chromium's sandbox refuses to run as root (CI containers).
      args: process.getuid?.() === 0 ? ['--no-sandbox'] : [],
      timeout: STEP_MS * 2,
    });
    const newPage = async (address) => {
      const context = await browser.newContext({
        viewport: { width: 1280, height: 900 },
        extraHTTPHeaders: { 'X-Forwarded-For': address },
      });
      context.setDefaultTimeout(STEP_MS);
      context.setDefaultNavigationTimeout(STEP_MS * 2);
      const page = await context.newPage();
      track(page);
      // Deleting asks for confirmation.
      page.on('dialog', (d) => d.accept());
      return page;
    };
    // Two users at two addresses (TEST-NET-1).
    admin = await newPage('192.0.2.1');
    user = await newPage('192.0.2.2');
  });
  after(async () => {
    await browser?.close();
    await cluster.tearDown();
  });

  uiTest('the first user registers, is the administrator, and makes a site', async () => {
    await go(admin, `${MANAGER_URL}/register`);
    await admin.getByLabel('Username').fill(ADMIN.uid);
    await admin.getByLabel('First name').fill(ADMIN.given);
    await admin.getByLabel('Last name').fill(ADMIN.sn);
    await admin.getByLabel('Email').fill(ADMIN.mail);
    await admin.getByLabel(/^Password/).fill(ADMIN.password);
    await admin.getByLabel('Confirm password').fill(ADMIN.password);
    await admin.getByRole('button', { name: 'Create account' }).click();
    await admin.waitForURL(/\/register\/success/);
    await signIn(admin, ADMIN);

    await go(admin, `${MANAGER_URL}/sites/new`);
    await admin.getByLabel(/^Name\b/).fill('ui');
    await admin.getByLabel('Internal domain').fill('ui.internal');
    await admin.getByLabel('DHCP range').fill('10.0.2.100-10.0.2.200');
    await admin.getByLabel('Subnet mask').fill('255.255.255.0');
    await admin.getByLabel('Gateway').fill('10.0.2.1');
    await admin.getByLabel('DNS forwarders').fill('8.8.8.8');
    await admin.getByRole('button', { name: /create|save/i }).click();
    await admin.waitForURL(/\/sites\/\d+\/containers/);
    siteId = new URL(admin.url()).pathname.split('/')[2];
  });

  uiTest('a kubernetes node through the form: the refusal on its field, then created', async () => {
    await go(admin, `${MANAGER_URL}/sites/${siteId}/nodes/new`);
    await admin.getByLabel(/^Name\b/).fill('k8s');
    await admin.locator('select').selectOption('kubernetes');
    // Proxmox's fields go; the node's connection comes.
    await assert.doesNotReject(admin.getByLabel('Kubeconfig path').waitFor());
    assert.equal(await admin.getByLabel('Proxmox API URL').count(), 0);
    assert.equal(await admin.getByLabel('API token ID').count(), 0);
    assert.equal(await admin.getByLabel('Network bridge').count(), 0);
    await admin.getByLabel('Kubeconfig path').fill(kubeconfig);

    // No namespace: Manager's API refuses, and the form says so on the Namespace field.
    await admin.getByRole('button', { name: 'Create node' }).click();
    const namespace = admin.getByLabel('Namespace');
    const refusal = 'kubeNamespace must be a Kubernetes namespace name';
    await admin.locator('input[name="kubeNamespace"][aria-invalid="true"]').waitFor();
    const described = await namespace.evaluate((el) =>
      (el.getAttribute('aria-describedby') || '').split(' ').map((id) => document.getElementById(id)?.textContent || '').join(' '),
    );
    const near = await namespace.evaluate((el) => el.closest('div')?.parentElement?.textContent || '');
    assert.ok(described.includes(refusal) || near.includes(refusal), 'the refusal is shown with the Namespace field');
    assert.match(admin.url(), /\/nodes\/new$/, 'still on the form');
    await shot(admin, 'node-refused');

    await namespace.fill(cluster.namespace);
    await admin.getByRole('button', { name: 'Create node' }).click();
    await admin.waitForURL(/\/nodes$/);
    const node = admin.locator('article').filter({ hasText: 'k8s' });
    await node.getByText('Kubernetes', { exact: true }).waitFor();
    await node.getByText(cluster.namespace, { exact: true }).waitFor();
    await node.getByText('Kubeconfig set').waitFor();
    const listed = await node.textContent();
    assert.ok(!/Missing/.test(listed), `no "Missing" credentials: ${listed}`);
    assert.ok(!(await admin.content()).includes(kubeconfig), 'the kubeconfig path is never shown');
    await shot(admin, 'nodes');

    // Edit: the path stays write-only (blank, "set"), the namespace is shown.
    await node.getByRole('link', { name: 'Edit' }).click();
    await admin.getByLabel('Namespace').waitFor();
    assert.equal(await admin.getByLabel('Namespace').inputValue(), cluster.namespace);
    assert.equal(await admin.getByLabel('Kubeconfig path').inputValue(), '');
    // The field's description (aria-describedby) says a path is set.
    const kubeconfigField = admin.getByLabel('Kubeconfig path');
    await admin.waitForFunction(
      (el) => (el.getAttribute('aria-describedby') || '').split(' ').some((id) => /A kubeconfig is set \(never shown\)/.test(document.getElementById(id)?.textContent || '')),
      await kubeconfigField.elementHandle(),
    );
    await admin.getByRole('button', { name: 'Save changes' }).click();
    await admin.waitForURL(/\/nodes$/);
    await admin.locator('article').filter({ hasText: 'k8s' }).getByText('Kubeconfig set').waitFor();
  });

  uiTest('the administrator adds a second user, who signs in (once)', async () => {
    await go(admin, `${MANAGER_URL}/users/new`);
    await admin.getByLabel('Username').fill(USER.uid);
    await admin.getByLabel('First name').fill(USER.given);
    await admin.getByLabel('Last name').fill(USER.sn);
    await admin.getByLabel('Email').fill(USER.mail);
    await admin.getByLabel(/^Password/).fill(USER.password);
    await choose(admin, 'Status', 'Active');
    await admin.getByRole('button', { name: /create|save/i }).click();
    await admin.waitForURL(/\/users$/);
    await signIn(user, USER);
  });

  const create = async (hostname, image) => {
    await go(user, `${MANAGER_URL}/sites/${siteId}/containers/new`);
    await user.getByRole('textbox', { name: 'Hostname' }).fill(hostname);
    await choose(user, 'Template', 'Custom…');
    await user.getByLabel('Custom image').fill(image);
    // Leaving the field looks the image up (its ports, from the registry), and the form is
    // disabled until the answer: a click meanwhile is lost, as a user's would be. kwok's images
    // are in no registry, so the look-up fails, after as long as DNS takes (6 s seen): wait
    // for its message first.
    await user.getByLabel('Custom image').blur();
    await user.getByText(/Fetch metadata" to try again|Loaded metadata/).waitFor({ timeout: STEP_MS });
    await user.getByRole('button', { name: 'Create container' }).click();
    // Manager shows the create job.
    await user.waitForURL(/\/jobs\/\d+/, { timeout: STEP_MS * 2 });
  };

  uiTest('the second user makes a container: Running, with its address; restarts it', async () => {
    await create('web', 'kwok.example/library/web:1');
    const list = `${MANAGER_URL}/sites/${siteId}/containers`;
    await reloadUntil(user, list, 'web to show Running with an address', async (page) => {
      const web = card(page, 'web');
      await web.getByText('Running', { exact: true }).waitFor({ timeout: 3000 });
      const text = await web.textContent();
      assert.match(text, /IPv4\s*\d+\.\d+\.\d+\.\d+/);
    });
    const mw = await cluster.workload('web');
    const web = card(user, 'web');
    assert.ok((await web.textContent()).includes(mw.status.address), `the workload's address ${mw.status.address}`);
    // No Proxmox console for a kubernetes node: the node's name, not a link.
    assert.equal(await web.getByRole('link', { name: 'k8s' }).count(), 0);
    await shot(user, 'containers-running');

    // Restart through the edit form: a job that stops and starts it.
    const podsBefore = (await cluster.pods('web')).map((p) => p.metadata.uid);
    await web.getByRole('link', { name: 'Edit' }).click();
    const restart = user.getByRole('switch', { name: 'Restart container after saving' });
    await restart.click();
    assert.equal(await restart.getAttribute('aria-checked'), 'true', 'the restart switch is on');
    const put = user.waitForResponse((r) => r.request().method() === 'PUT' && /\/api\/v1\/sites\/\d+\/containers\/\d+$/.test(r.url()));
    await user.getByRole('button', { name: 'Save changes' }).click();
    const response = await put;
    assert.equal(response.status(), 200, `PUT: ${await response.text()}`);
    await user.waitForURL(/\/jobs\/\d+/, { timeout: STEP_MS * 2 });
    await user.getByText('web Running').first().waitFor({ timeout: JOB_MS });
    assert.ok((await user.textContent('body')).includes('No change: restarting'));
    const pods = await cluster.pods('web');
    assert.ok(pods.every((p) => !podsBefore.includes(p.metadata.uid)), 'a new Pod');
    await reloadUntil(user, list, 'web Running again', (page) => card(page, 'web').getByText('Running', { exact: true }).waitFor({ timeout: 3000 }));
  });

  uiTest('a bad image: Failed, its reason one click away; both deleted', async () => {
    // kwok (hack/kwok/stages.yaml) never lets this image pull.
    await create('broken', 'kwok.example/image-pull-backoff');
    const list = `${MANAGER_URL}/sites/${siteId}/containers`;
    await reloadUntil(user, list, 'broken to show Failed', (page) => card(page, 'broken').getByText('Failed', { exact: true }).waitFor({ timeout: 3000 }));
    await shot(user, 'containers-failed');
    await card(user, 'broken').getByRole('link', { name: 'Why?' }).click();
    await user.waitForURL(/\/jobs\/\d+/);
    await user.getByText(/broken failed: ImagePullBackOff/).first().waitFor({ timeout: JOB_MS });
    await shot(user, 'job-failed');

    for (const hostname of ['broken', 'web']) {
      await go(user, list);
      await card(user, hostname).getByRole('button', { name: 'Delete' }).click();
      await reloadUntil(user, list, `${hostname} to go`, async (page) => {
        await page.waitForLoadState('networkidle');
        assert.equal(await card(page, hostname).count(), 0);
      }, STEP_MS * 2);
      assert.equal(await cluster.workload(hostname), null, `${hostname}'s workload is gone`);
    }
  });
});
