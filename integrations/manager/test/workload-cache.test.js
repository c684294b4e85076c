// Manager's pages read a node's workloads through clusterResources on every load: one list,
// then a watch keeps the table current (lib/workload-cache.js). A local HTTP server stands in
// for the API server: it answers lists, holds watches open and sends their events, and counts
// every request.
'use strict';

const { after, afterEach, before, describe, test } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const path = require('node:path');
const { execFile } = require('node:child_process');

const m = require('../lib/mapping');
const { KubernetesApi } = require('../lib/kubernetes-api');
const { WorkloadCache, timing } = require('../lib/workload-cache');
const { waitUntil, sleep } = require('../testing/cluster');

const NS = 'workloads';
const COLLECTION = `/apis/${m.GROUP}/${m.VERSION}/namespaces/${NS}/${m.PLURAL}`;
const DEFAULT_TIMING = { ...timing };

/** Workload `name` of node `nodeId` in `phase` (Failed: Stalled, with `reason`). */
function workload(nodeId, name, phase = 'Running', reason = null) {
  const conditions =
    phase === 'Failed'
      ? [{ type: 'Stalled', status: 'True', reason, observedGeneration: 1 }]
      : [{ type: 'Ready', status: phase === 'Running' ? 'True' : 'False', observedGeneration: 1 }];
  return {
    apiVersion: `${m.GROUP}/${m.VERSION}`,
    kind: m.KIND,
    metadata: { name, namespace: NS, generation: 1, labels: { [m.NODE_ID_LABEL]: String(nodeId), [m.PROVIDER_LABEL]: m.PROVIDER_VALUE } },
    spec: { image: 'nginx' },
    status: { observedGeneration: 1, phase, conditions },
  };
}

/** The fake API server: `items` to list, `watches` held open, `requests` seen. */
function apiServer() {
  const state = { items: [], rv: 100, watches: [], requests: [], list: null, watch: null };
  const server = http.createServer((req, res) => {
    // A client that hangs up mid-watch is no error here.
    req.resume();
    req.on('error', () => {});
    const url = new URL(req.url, 'http://x');
    const watch = url.searchParams.get('watch') === 'true';
    state.requests.push({ watch, path: url.pathname, query: Object.fromEntries(url.searchParams), authorization: req.headers.authorization });
    const send = (code, obj) => {
      res.writeHead(code, { 'content-type': 'application/json' });
      res.end(JSON.stringify(obj));
    };
    if (url.pathname !== COLLECTION) return send(404, { kind: 'Status', code: 404, message: 'not found' });
    if (!watch) {
      // `list`: [code, message] to refuse the next lists.
      if (state.list) return send(state.list[0], { kind: 'Status', code: state.list[0], message: state.list[1] });
      return send(200, { kind: 'ManagedWorkloadList', metadata: { resourceVersion: String(state.rv) }, items: state.items });
    }
    // `watch`: a code to refuse watches with.
    if (state.watch) return send(state.watch, { kind: 'Status', code: state.watch, message: 'watch refused' });
    res.writeHead(200, { 'content-type': 'application/json' });
    res.flushHeaders();
    state.watches.push(res);
    res.on('close', () => (state.watches = state.watches.filter((w) => w !== res)));
  });
  /** An event to every open watch, with the next resourceVersion. */
  state.emit = (type, object) => {
    state.rv += 1;
    const obj = { ...object, metadata: { ...object.metadata, resourceVersion: String(state.rv) } };
    for (const w of state.watches) w.write(`${JSON.stringify({ type, object: obj })}\n`);
  };
  /** The API server ends every open watch, as at its timeoutSeconds. */
  state.endWatches = () => state.watches.forEach((w) => w.end());
  state.lists = () => state.requests.filter((r) => !r.watch).length;
  state.watchRequests = () => state.requests.filter((r) => r.watch);
  return { server, state };
}

describe("a node's workloads for Manager's pages: one list, then a watch", () => {
  const { server, state } = apiServer();
  let url;
  const kubeconfig = (token = 'test') =>
    JSON.stringify({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name: 'lab', cluster: { server: url, 'insecure-skip-tls-verify': true } }],
      users: [{ name: 'manager', user: { token } }],
      contexts: [{ name: 'manager', context: { cluster: 'lab', user: 'manager' } }],
      'current-context': 'manager',
    });
  // A new provider for each page load, as Manager's node.api() makes one.
  const page = (node, token) =>
    new KubernetesApi({ name: 'k8s', ...node, kubeNamespace: NS }, { kubeconfig: kubeconfig(token), env: { MW_KUBECONFIG_ALLOW_INSECURE_TLS: '1' }, log: () => {} }).clusterResources('lxc');
  const watchOpen = (count) => waitUntil(`${count} watch requests`, () => state.watchRequests().length, (n) => n >= count, 5000);

  before(async () => {
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${server.address().port}`;
  });
  afterEach(() => {
    WorkloadCache.closeAll();
    Object.assign(timing, DEFAULT_TIMING);
    Object.assign(state, { items: [], requests: [], list: null, watch: null });
  });
  after(() => {
    server.closeAllConnections();
    server.close();
  });

  test('one list serves every page load; each change arrives by the watch', async () => {
    state.items = [workload(1, 'web'), workload(1, 'db', 'Creating')];
    const first = await page({ id: 1 });
    assert.deepEqual(
      first.map((r) => [r.vmid, r.status, r.managerStatus, r.reason, r.node]),
      [
        [`${NS}/web`, 'running', 'running', null, 'k8s'],
        [`${NS}/db`, 'stopped', 'creating', null, 'k8s'],
      ],
    );
    await watchOpen(1);
    const [list] = state.requests;
    assert.equal(list.query.labelSelector, `${m.NODE_ID_LABEL}=1,${m.PROVIDER_LABEL}=${m.PROVIDER_VALUE}`);
    const [watch] = state.watchRequests();
    assert.deepEqual(
      [watch.query.labelSelector, watch.query.resourceVersion, watch.query.allowWatchBookmarks, watch.authorization],
      [list.query.labelSelector, '100', 'true', 'Bearer test'],
    );

    // Twenty page loads: nothing asked of the API server.
    for (let i = 0; i < 20; i++) assert.deepEqual(await page({ id: 1 }), first);
    assert.equal(state.requests.length, 2, 'one list, one watch');

    state.emit('MODIFIED', workload(1, 'db', 'Failed', 'ImagePullBackOff'));
    state.emit('ADDED', workload(1, 'cache'));
    state.emit('DELETED', workload(1, 'web'));
    const shown = await waitUntil('the changes', () => page({ id: 1 }), (rows) => rows.length === 2 && rows.some((r) => r.name === 'cache'), 5000);
    assert.deepEqual(
      shown.map((r) => [r.name, r.managerStatus, r.reason]),
      [
        ['db', 'failed', 'ImagePullBackOff'],
        ['cache', 'running', null],
      ],
    );
    // The node's name as Manager has it now (a renamed node): read, not kept.
    assert.deepEqual([...new Set((await page({ id: 1, name: 'renamed' })).map((r) => r.node))], ['renamed']);
    assert.equal(state.lists(), 1);
  });

  test('the API server ends the watch: resumed from the last resourceVersion, no list', async () => {
    state.items = [workload(2, 'web')];
    await page({ id: 2 });
    await watchOpen(1);
    state.emit('MODIFIED', workload(2, 'web', 'Stopped'));
    await waitUntil('the change', () => page({ id: 2 }), (rows) => rows[0].managerStatus === 'offline', 5000);
    state.endWatches();
    await watchOpen(2);
    assert.equal(state.watchRequests()[1].query.resourceVersion, String(state.rv), 'from the last event');
    state.emit('MODIFIED', workload(2, 'web'));
    await waitUntil('the change after the new watch', () => page({ id: 2 }), (rows) => rows[0].managerStatus === 'running', 5000);
    assert.equal(state.lists(), 1);
  });

  test('a watch that fails (410 Gone, a refusal): the next read lists again', async () => {
    state.items = [workload(3, 'web')];
    await page({ id: 3 });
    await watchOpen(1);
    for (const w of state.watches) w.write(`${JSON.stringify({ type: 'ERROR', object: { kind: 'Status', code: 410, reason: 'Expired', message: 'too old resource version' } })}\n`);
    await waitUntil('the table dropped', () => WorkloadCache.size, (n) => n === 0, 5000);
    state.items = [workload(3, 'web', 'Stopped')];
    assert.deepEqual((await page({ id: 3 })).map((r) => r.managerStatus), ['offline'], 'listed again');
    assert.equal(state.lists(), 2);

    // A Role without `watch` (one applied before the provider watched): each read lists, as
    // before, and shows what the list says.
    WorkloadCache.closeAll();
    state.requests = [];
    state.watch = 403;
    for (let i = 0; i < 3; i++) {
      assert.deepEqual((await page({ id: 3 })).map((r) => r.managerStatus), ['offline']);
      await waitUntil('the refused watch to end the table', () => WorkloadCache.size, (n) => n === 0, 5000);
    }
    assert.equal(state.lists(), 3);
  });

  test('a list that fails: the API server’s words (Manager’s unknown), and the next read tries again', async () => {
    state.list = [403, 'managedworkloads is forbidden: User "system:serviceaccount:workloads:manager" cannot list resource "managedworkloads"'];
    await assert.rejects(page({ id: 4 }), (err) => {
      assert.equal(err.name, 'KubernetesError');
      assert.equal(err.message, `listing ${NS}'s workloads: Kubernetes API 403: ${state.list[1]}`);
      return true;
    });
    assert.equal(WorkloadCache.size, 0);
    state.list = null;
    state.items = [workload(4, 'web')];
    assert.deepEqual((await page({ id: 4 })).map((r) => r.name), ['web']);
  });

  test('nobody reads: the table is dropped at the next renewal; a watch silent past its timeout is not trusted', async () => {
    timing.idleMs = 50;
    state.items = [workload(5, 'web')];
    await page({ id: 5 });
    await watchOpen(1);
    await sleep(100);
    state.endWatches();
    await waitUntil('the idle table dropped', () => WorkloadCache.size, (n) => n === 0, 5000);
    await sleep(100);
    assert.equal(state.watchRequests().length, 1, 'not renewed');

    // A watch the API server should have ended by now, and did not: cut without a word.
    Object.assign(timing, DEFAULT_TIMING, { watchSeconds: 1, graceMs: 0 });
    state.requests = [];
    await page({ id: 5 });
    await watchOpen(1);
    await page({ id: 5 });
    assert.equal(state.lists(), 1);
    await sleep(1100);
    await page({ id: 5 });
    assert.equal(state.lists(), 2, 'listed again');
  });

  test('another kubeconfig (a rotated token): a table of its own, with its credentials', async () => {
    state.items = [workload(6, 'web')];
    await page({ id: 6 }, 'old-token');
    await page({ id: 6 }, 'new-token');
    assert.equal(state.lists(), 2);
    await watchOpen(2);
    assert.deepEqual(state.watchRequests().map((r) => r.authorization).sort(), ['Bearer new-token', 'Bearer old-token']);
    assert.equal(WorkloadCache.size, 2);
  });

  test('the watch keeps no process alive: one that reads once ends (a job, the README’s check)', async () => {
    state.items = [workload(7, 'web')];
    const script = `
      const { KubernetesApi } = require(${JSON.stringify(path.join(__dirname, '..'))});
      const api = new KubernetesApi({ id: 7, name: 'k8s', kubeNamespace: ${JSON.stringify(NS)} }, { kubeconfig: process.env.KC, env: { MW_KUBECONFIG_ALLOW_INSECURE_TLS: '1' } });
      api.clusterResources('lxc').then((rows) => setTimeout(() => console.log(rows.length), 300));
    `;
    // Kept alive, it would renew its watch every minute for five (timing.idleMs), and be
    // killed at the limit: that is the failure.
    const out = await new Promise((resolve, reject) =>
      execFile(process.execPath, ['-e', script], { env: { ...process.env, KC: kubeconfig() }, timeout: 60_000 }, (err, stdout) => (err ? reject(err) : resolve(stdout))),
    );
    assert.equal(out.trim(), '1');
    assert.ok(state.watchRequests().length >= 1, 'it did watch');
  });
});
