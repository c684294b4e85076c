// Manager's container list at scale, a benchmark (hack/manager-e2e.sh's "pages" suite, a part
// of `make bench`): it prints figures and asserts nothing about time. Two sites, one with a
// `kubernetes` node (the provider on the operator), one with Manager's own `dummy` node; each
// gets N containers made through Manager's REST API, as a user makes them (a create job each,
// run by job-runner.js), then GET /api/v1/sites/:id/containers is timed on both, one list
// after the other, alternating. Beside the times: the requests Manager's identity made to the
// API server per list (the control plane's audit log, which logs that identity's reads too:
// hack/audit-policy.yaml), the API server's CPU per list (/proc, net of its CPU at rest), and
// the Manager server's RSS (the provider runs in it) before and after the lists.
//
// The dummy node's create jobs look the image up in its registry (Manager's docker-registry.js,
// over HTTPS): this file serves that registry on localhost:443 with the certificate
// hack/manager-e2e.sh made, which the job runner trusts (NODE_EXTRA_CA_CERTS).
'use strict';

const fs = require('node:fs');
const https = require('node:https');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const k8s = require('@kubernetes/client-node');

const m = require('../lib/mapping');
const { Cluster, inBatches, sleep, waitUntil } = require('../testing/cluster');
const { Manager } = require('../testing/manager');

const env = process.env;
const needed = ['MANAGER_URL', 'MANAGER_LOGS', 'MANAGER_PID', 'MW_TEST_KUBECONFIG', 'MW_E2E_STORAGE_CLASS', 'MW_BENCH_AUDIT_DIR', 'MW_BENCH_APISERVER_PID_FILE', 'MW_BENCH_REGISTRY_KEY', 'MW_BENCH_REGISTRY_CERT'];
const missing = needed.filter((k) => !env[k]);
if (missing.length) {
  console.error(`run by hack/manager-e2e.sh with MW_MANAGER_E2E_SUITES=pages (missing: ${missing.join(', ')})`);
  process.exit(2);
}
const SIZES = (env.MW_BENCH_PAGES_SIZES || '100,1000').split(',').map(Number);
const LISTS = Number(env.MW_BENCH_PAGES_LISTS || 100);
// Create jobs in flight at once: each is a node process (about a second of CPU) that then
// waits on its container; more than a few per core only queues them.
const WIDTH = Number(env.MW_BENCH_PAGES_CONCURRENCY || 8);
// The namespace hack/audit-policy.yaml names: Manager's identity there is audited reads too.
const NAMESPACE = 'mw-bench-pages';
const USER = `system:serviceaccount:${NAMESPACE}:manager`;
const IMAGE = 'localhost/library/bench:1';
const IDLE_SECONDS = 10;
/** Page loads of each node before the timed ones. */
const WARM_UP = 5;

const log = (line) => console.error(`[pages] ${line}`);
const TICK = Number(execFileSync('getconf', ['CLK_TCK']).toString());

/** A process's CPU seconds (user + system) from /proc. */
function cpuSeconds(pid) {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / TICK;
}

/** A process's resident and peak resident memory, in MiB. */
function memory(pid) {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (key) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(status)[1]);
  return { rss: kb('VmRSS') / 1024, peak: kb('VmHWM') / 1024 };
}

/**
 * Requests by `user` the API server received between `from` and `to` (ms), by verb and
 * resource: each once (a watch is logged as it starts and again as it ends).
 */
function auditedRequests(user, from, to) {
  const dir = env.MW_BENCH_AUDIT_DIR;
  const files = fs.readdirSync(dir).filter((n) => /^audit-.*\.log$/.test(n)).sort();
  files.push('audit.log');
  const counts = {};
  const seen = new Set();
  const quoted = JSON.stringify(user);
  for (const file of files) {
    for (const line of fs.readFileSync(path.join(dir, file), 'utf8').split('\n')) {
      if (!line.includes(quoted)) continue;
      const e = JSON.parse(line);
      if (e.user?.username !== user || seen.has(e.auditID)) continue;
      const at = Date.parse(e.requestReceivedTimestamp);
      if (at < from || at > to) continue;
      seen.add(e.auditID);
      const what = `${e.verb} ${e.objectRef?.resource ?? e.requestURI}${e.objectRef?.subresource ? `/${e.objectRef.subresource}` : ''}`;
      counts[what] = (counts[what] || 0) + 1;
    }
  }
  return { total: seen.size, counts };
}

/** The registry the dummy node's create jobs ask for the image's digest. */
async function startRegistry() {
  const manifest = JSON.stringify({
    schemaVersion: 2,
    mediaType: 'application/vnd.oci.image.manifest.v1+json',
    config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: `sha256:${'5e'.repeat(32)}`, size: 2 },
    layers: [],
  });
  const tls = { key: fs.readFileSync(env.MW_BENCH_REGISTRY_KEY), cert: fs.readFileSync(env.MW_BENCH_REGISTRY_CERT) };
  const servers = [];
  // `localhost` may resolve to either address first.
  for (const host of ['127.0.0.1', '::1']) {
    const server = https.createServer(tls, (req, res) => {
      if (req.method === 'GET' && req.url.startsWith('/v2/library/bench/manifests/')) {
        res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json' });
        res.end(manifest);
      } else {
        res.writeHead(404, { 'content-type': 'application/json' });
        res.end('{"errors":[{"code":"MANIFEST_UNKNOWN"}]}');
      }
    });
    try {
      await new Promise((resolve, reject) => server.once('error', reject).listen(443, host, resolve));
      servers.push(server);
    } catch (err) {
      if (host === '127.0.0.1') throw new Error(`the registry on ${host}:443: ${err.message}`);
      log(`no registry on [${host}]:443 (${err.code}); 127.0.0.1 serves it`);
    }
  }
  return () => servers.forEach((s) => s.close());
}

/**
 * Containers `names` on the site through Manager's API, as the REST suite makes them: one POST
 * at a time (each allocates an external port for the SSH service, under a lock), their create
 * jobs `WIDTH` at a time, each waited for to its end.
 */
async function createContainers(manager, site, names) {
  const started = Date.now();
  const failed = [];
  const running = new Set();
  for (const hostname of names) {
    while (running.size >= WIDTH) await Promise.race(running);
    const made = await manager.ok('POST', `/sites/${site.id}/containers`, {
      hostname,
      template: 'custom',
      customTemplate: IMAGE,
      services: { 0: { type: 'tcp', internalPort: 22 } },
    });
    const wait = manager
      .job(made.jobId, 600_000)
      .then((job) => {
        if (job.status !== 'success') failed.push({ hostname, jobId: made.jobId, output: job.output.slice(-500) });
      })
      .finally(() => running.delete(wait));
    running.add(wait);
  }
  await Promise.all(running);
  return { seconds: (Date.now() - started) / 1000, made: names.length, failed };
}

/** One page load's list: its time to the last byte, in ms, and its containers. */
async function list(manager, site) {
  const started = process.hrtime.bigint();
  const res = await fetch(`${manager.url}/api/v1/sites/${site.id}/containers`, { headers: { cookie: manager.cookie } });
  const text = await res.text();
  const ms = Number(process.hrtime.bigint() - started) / 1e6;
  if (res.status !== 200) throw new Error(`listing site ${site.id}: ${res.status} ${text.slice(0, 500)}`);
  return { ms, containers: JSON.parse(text).data };
}

const percentile = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
const stats = (times) => {
  const sorted = [...times].sort((a, b) => a - b);
  return { p50: percentile(sorted, 50), p99: percentile(sorted, 99), mean: sorted.reduce((a, b) => a + b, 0) / sorted.length };
};
const statusCounts = (containers) => containers.reduce((acc, c) => ({ ...acc, [c.status]: (acc[c.status] || 0) + 1 }), {});

/**
 * What an earlier run left, gone first: its namespace (a thousand workloads take the garbage
 * collector minutes) and its volumes, whose names this run uses again.
 */
async function clearEarlierRun(core) {
  const exists = () => core.readNamespace({ name: NAMESPACE }).then(
    (ns) => ns,
    (err) => {
      if (err.code === 404) return null;
      throw err;
    },
  );
  const ns = await exists();
  if (ns) {
    log(`namespace ${NAMESPACE} of an earlier run: deleted, and waited for`);
    if (!ns.metadata.deletionTimestamp) await core.deleteNamespace({ name: NAMESPACE });
    await waitUntil(`namespace ${NAMESPACE} to go`, exists, (n) => n === null, 30 * 60_000);
  }
  const earlier = async () => (await core.listPersistentVolume()).items.map((pv) => pv.metadata.name).filter((n) => n.startsWith(`${NAMESPACE}-pv`));
  await inBatches(await earlier(), (name) => core.deletePersistentVolume({ name }).catch(() => {}));
  await waitUntil('the volumes of an earlier run to go', earlier, (names) => names.length === 0, 10 * 60_000);
}

/** The provider's list as the API server answers it (the admin's read): its size in bytes. */
async function listBytes(kubeconfigPath) {
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(kubeconfigPath);
  const custom = kc.makeApiClient(k8s.CustomObjectsApi);
  const answer = await custom.listNamespacedCustomObject({ group: m.GROUP, version: m.VERSION, plural: m.PLURAL, namespace: NAMESPACE });
  return JSON.stringify(answer).length;
}

async function main() {
  const manager = new Manager(env.MANAGER_URL);
  const cluster = new Cluster(env.MW_TEST_KUBECONFIG, 'mw-bench-pages', { storageClass: env.MW_E2E_STORAGE_CLASS, capacity: '100Gi', namespace: NAMESPACE });
  const apiserverPid = fs.readFileSync(env.MW_BENCH_APISERVER_PID_FILE, 'utf8').trim();
  const managerPid = env.MANAGER_PID;
  const stopRegistry = await startRegistry();
  const results = { date: new Date().toISOString(), lists: LISTS, width: WIDTH, sizes: [] };
  try {
    await clearEarlierRun(cluster.core);
    await cluster.setUp(0);
    const kubeconfig = path.join(env.MANAGER_LOGS, 'manager.kubeconfig');
    fs.writeFileSync(kubeconfig, await cluster.managerKubeconfig(), { mode: 0o600 });
    await manager.registerAdmin();
    const sites = { kubernetes: await manager.site('pages-k8s', 10), dummy: await manager.site('pages-dummy', 11) };
    await manager.ok('POST', `/sites/${sites.kubernetes.id}/nodes`, { name: 'k8s', nodeType: 'kubernetes', kubeconfigPath: kubeconfig, kubeNamespace: NAMESPACE });
    await manager.ok('POST', `/sites/${sites.dummy.id}/nodes`, { name: 'dummy', nodeType: 'dummy' });
    const memoryAtStart = memory(managerPid);

    let have = 0;
    for (const n of SIZES) {
      const names = Array.from({ length: n - have }, (_, i) => `c${String(have + i).padStart(5, '0')}`);
      const size = { n, setup: {}, lists: {}, memory: {} };
      log(`N = ${n}: ${names.length} more containers on each node`);
      await cluster.addVolumes(names.length);
      for (const node of ['kubernetes', 'dummy']) {
        size.setup[node] = await createContainers(manager, sites[node], names);
        const s = size.setup[node];
        log(`  ${node}: ${s.made} made in ${s.seconds.toFixed(1)} s, ${s.failed.length} create jobs failed`);
        for (const f of s.failed.slice(0, 3)) log(`    ${f.hostname} (job ${f.jobId}): ${f.output.trim().split('\n').slice(-2).join(' | ')}`);
      }
      have = n;
      // The operator's last writes (Events, status details) settle; a few lists warm both up.
      await sleep(5000);
      const warmFrom = Date.now();
      for (const node of ['kubernetes', 'dummy']) {
        let last;
        for (let i = 0; i < WARM_UP; i++) last = await list(manager, sites[node]);
        size.statuses = { ...size.statuses, [node]: statusCounts(last.containers) };
        log(`  ${node}: the list shows ${JSON.stringify(size.statuses[node])}`);
      }
      const warmTo = Date.now();
      size.listBytes = await listBytes(env.MW_TEST_KUBECONFIG);

      // The API server's CPU at rest, to take out of the lists' share.
      const idleFrom = cpuSeconds(apiserverPid);
      await sleep(IDLE_SECONDS * 1000);
      const idlePerSecond = (cpuSeconds(apiserverPid) - idleFrom) / IDLE_SECONDS;

      size.memory.before = memory(managerPid);
      const times = { kubernetes: [], dummy: [] };
      // The Manager server's CPU in each list (it does nothing else meanwhile): a figure that
      // holds however busy the machine is, where the times do not.
      const managerCpu = { kubernetes: 0, dummy: 0 };
      const from = Date.now();
      const cpuFrom = cpuSeconds(apiserverPid);
      for (let i = 0; i < LISTS; i++) {
        // Alternating, so that whatever else the machine does falls on both alike.
        for (const node of i % 2 ? ['dummy', 'kubernetes'] : ['kubernetes', 'dummy']) {
          const before = cpuSeconds(managerPid);
          times[node].push((await list(manager, sites[node])).ms);
          managerCpu[node] += cpuSeconds(managerPid) - before;
        }
      }
      const cpu = cpuSeconds(apiserverPid) - cpuFrom;
      const to = Date.now();
      size.memory.after = memory(managerPid);
      // The audit log is written as each request completes; a moment for the last lines.
      await sleep(1000);
      const audited = auditedRequests(USER, from, to);
      size.warmUp = auditedRequests(USER, warmFrom, warmTo).counts;
      const seconds = (to - from) / 1000;
      size.apiserver = {
        requestsPerList: audited.total / LISTS,
        byKind: Object.fromEntries(Object.entries(audited.counts).map(([k, v]) => [k, v / LISTS])),
        cpuPerListMs: ((cpu - idlePerSecond * seconds) / LISTS) * 1000,
        cpuGrossPerListMs: (cpu / LISTS) * 1000,
        idleCpuPerSecond: idlePerSecond,
      };
      for (const node of ['kubernetes', 'dummy']) size.lists[node] = { ...stats(times[node]), managerCpuMs: (managerCpu[node] / LISTS) * 1000 };
      results.sizes.push(size);
      log(`  lists: kubernetes p50 ${size.lists.kubernetes.p50.toFixed(1)} ms p99 ${size.lists.kubernetes.p99.toFixed(1)} ms; dummy p50 ${size.lists.dummy.p50.toFixed(1)} ms p99 ${size.lists.dummy.p99.toFixed(1)} ms`);
    }
    results.memoryAtStart = memoryAtStart;
  } finally {
    stopRegistry();
    log('tearing down the namespace and its volumes');
    await cluster.tearDown();
  }
  const md = markdown(results);
  console.log(md);
  if (env.MW_BENCH_OUT) {
    fs.writeFileSync(env.MW_BENCH_OUT, `${md}\n`);
    fs.writeFileSync(env.MW_BENCH_OUT.replace(/\.md$/, '.json'), `${JSON.stringify(results, null, 2)}\n`);
  }
}

function markdown(r) {
  const ms = (x) => `${x.toFixed(1)} ms`;
  const mib = (x) => `${x.toFixed(1)} MiB`;
  const lines = [
    `## Manager's container list (GET /api/v1/sites/:id/containers), ${r.date.slice(0, 16)}Z`,
    '',
    `${r.lists} lists of each node per size, alternating, after ${WARM_UP} of each; create jobs ${r.width} at a time.`,
    '',
    `| containers | node | p50 | p99 | p99 / dummy p99 | Manager server CPU per list | API requests, the first ${WARM_UP} page loads | API requests per list, then | API server CPU per list | the node's list from the API server |`,
    '|---|---|---|---|---|---|---|---|---|---|',
  ];
  for (const s of r.sizes) {
    const k = s.lists.kubernetes;
    const d = s.lists.dummy;
    const kinds = Object.entries(s.apiserver.byKind).map(([what, per]) => `${per.toFixed(2)} ${what}`).join(', ');
    const warm = Object.entries(s.warmUp).map(([what, count]) => `${count} ${what}`).join(', ') || 'none';
    lines.push(`| ${s.n} | kubernetes | ${ms(k.p50)} | ${ms(k.p99)} | ${(k.p99 / d.p99).toFixed(2)}× | ${ms(k.managerCpuMs)} | ${warm} | ${s.apiserver.requestsPerList.toFixed(2)}${kinds ? ` (${kinds})` : ''} | ${ms(s.apiserver.cpuPerListMs)} | ${(s.listBytes / 1048576).toFixed(2)} MiB |`);
    lines.push(`| ${s.n} | dummy | ${ms(d.p50)} | ${ms(d.p99)} | | ${ms(d.managerCpuMs)} | | | | |`);
  }
  lines.push('', '| containers | setup, kubernetes node | setup, dummy node | statuses shown (kubernetes; dummy) | Manager server RSS before the lists → after (peak) |', '|---|---|---|---|---|');
  for (const s of r.sizes) {
    const setup = (x) => `${x.made} in ${x.seconds.toFixed(0)} s${x.failed.length ? `, ${x.failed.length} jobs failed` : ''}`;
    const shown = (c) => Object.entries(c).map(([k, v]) => `${v} ${k}`).join(', ');
    lines.push(`| ${s.n} | ${setup(s.setup.kubernetes)} | ${setup(s.setup.dummy)} | ${shown(s.statuses.kubernetes)}; ${shown(s.statuses.dummy)} | ${mib(s.memory.before.rss)} → ${mib(s.memory.after.rss)} (${mib(s.memory.after.peak)}) |`);
  }
  lines.push('', `Manager server RSS with both nodes and no containers: ${mib(r.memoryAtStart.rss)}.`);
  return lines.join('\n');
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
