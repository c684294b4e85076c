// Edges of what Manager asks and what it can store, without a cluster: a local HTTP server stands
// in for the API server, and the patch's Kubernetes reconfigure runs against a fake provider.
'use strict';

const { after, before, describe, test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('fs');
const http = require('http');
const path = require('path');

const m = require('../lib/mapping');
const { KubernetesApi, managerAddress } = require('../lib/kubernetes-api');

const PATCH = path.join(__dirname, '..', 'patches', 'manager-v2026.7.4.patch');
const ELB = 'a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6-1234567890.us-east-1.elb.amazonaws.com';

/** One ManagedWorkload of node 7, as the operator would have it. */
function workload(status = {}) {
  const { workload: mw } = m.desired(
    { namespace: 'workloads', nodeId: 7, containerId: 3, hostname: 'web', image: 'nginx', services: [{ type: 'http', internalPort: 80 }] },
    m.settingsFromEnv({}),
  );
  mw.metadata = { ...mw.metadata, generation: 2, resourceVersion: '10', uid: 'u-1' };
  mw.status = { observedGeneration: 2, phase: 'Running', ...status };
  return mw;
}

/** A fake API server holding `mw`; every request it got is in `requests`. */
function apiServer() {
  // conflicts: PUTs of the workload answered 409 (a status write moved its resourceVersion);
  // failures: PUTs of the workload answered 422 after those.
  const state = { mw: null, secret: null, conflicts: 0, failures: 0, requests: [] };
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      state.requests.push({ method: req.method, url: req.url, body: body ? JSON.parse(body) : null });
      const send = (code, obj) => {
        res.writeHead(code, { 'content-type': 'application/json' });
        res.end(JSON.stringify(obj));
      };
      const notFound = () => send(404, { kind: 'Status', code: 404, message: 'not found' });
      if (req.url.startsWith('/api/v1/namespaces/workloads/secrets')) {
        if (req.method === 'POST') {
          state.secret = { ...JSON.parse(body), metadata: { ...JSON.parse(body).metadata, resourceVersion: '1' } };
          return send(201, state.secret);
        }
        if (!state.secret) return notFound();
        if (req.method === 'GET') return send(200, state.secret);
        if (req.method === 'PUT') {
          const next = JSON.parse(body);
          next.metadata.resourceVersion = String(Number(state.secret.metadata.resourceVersion) + 1);
          state.secret = next;
          return send(200, next);
        }
      }
      if (req.url.startsWith('/apis/opensource-server.mieweb.org/v1alpha1/namespaces/workloads/managedworkloads/web')) {
        if (!state.mw) return notFound();
        if (req.method === 'GET') return send(200, state.mw);
        if (req.method === 'PUT' && state.conflicts > 0) {
          state.conflicts--;
          state.mw.metadata.resourceVersion = String(Number(state.mw.metadata.resourceVersion) + 1);
          return send(409, { kind: 'Status', code: 409, reason: 'Conflict', message: 'the object has been modified; please apply your changes to the latest version and try again' });
        }
        if (req.method === 'PUT' && JSON.parse(body).metadata.resourceVersion !== state.mw.metadata.resourceVersion) {
          return send(409, { kind: 'Status', code: 409, reason: 'Conflict', message: 'stale resourceVersion' });
        }
        if (req.method === 'PUT' && state.failures > 0) {
          state.failures--;
          return send(422, { kind: 'Status', code: 422, reason: 'Invalid', message: 'spec: Invalid value' });
        }
        if (req.method === 'PUT') {
          // As the API server: a new generation only for a changed spec.
          const same = JSON.stringify(body && JSON.parse(body).spec) === JSON.stringify(state.mw.spec);
          const next = JSON.parse(body);
          next.metadata.generation = state.mw.metadata.generation + (same ? 0 : 1);
          next.metadata.resourceVersion = String(Number(state.mw.metadata.resourceVersion) + 1);
          next.status = state.mw.status;
          state.mw = next;
          return send(200, next);
        }
        if (req.method === 'DELETE') {
          state.mw = null;
          return send(200, { kind: 'Status', status: 'Success' });
        }
      }
      return notFound();
    });
  });
  return { server, state };
}

describe('the provider against a fake API server', () => {
  const { server, state } = apiServer();
  let api;
  let kubeconfig;
  const lines = [];
  before(async () => {
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    kubeconfig = JSON.stringify({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name: 'lab', cluster: { server: `http://127.0.0.1:${server.address().port}`, 'insecure-skip-tls-verify': true } }],
      users: [{ name: 'manager', user: { token: 'test' } }],
      contexts: [{ name: 'manager', context: { cluster: 'lab', user: 'manager' } }],
      'current-context': 'manager',
    });
    api = new KubernetesApi({ id: 7, name: 'k8s', kubeNamespace: 'workloads' }, { kubeconfig, env: { MW_KUBECONFIG_ALLOW_INSECURE_TLS: '1' }, log: (l) => lines.push(l) });
  });
  after(() => server.close());

  test('a load balancer host name longer than ipv4Address: its IP, else no address and why', async () => {
    state.mw = workload({ address: ELB, service: { loadBalancerIngress: [ELB, '192.0.2.10'] } });
    assert.equal(await api.getLxcIpAddress('k8s', 'workloads/web'), '192.0.2.10');
    lines.length = 0;
    state.mw = workload({ address: ELB, service: { loadBalancerIngress: [ELB] } });
    assert.equal(await api.getLxcIpAddress('k8s', 'workloads/web'), null);
    assert.match(lines.join('\n'), /workloads\/web has no address for Manager: the load balancer's address \S+ \(71 characters\) does not fit Manager's ipv4Address \(at most 45\); use a load balancer that gives an IP, or MW_SERVICE_TYPE=ClusterIP/);
    // What fits is kept as it is, a host name too.
    state.mw = workload({ address: 'lb.example.org', service: { loadBalancerIngress: ['lb.example.org', '192.0.2.10'] } });
    assert.equal(await api.getLxcIpAddress('k8s', 'workloads/web'), 'lb.example.org');
    assert.deepEqual(managerAddress(workload({ address: '10.96.0.12' })), { address: '10.96.0.12' });
    assert.deepEqual(managerAddress(workload({})), { address: null });
  });

  test('swap: not applied, said in the output, and no new generation', async () => {
    state.mw = workload({ address: '10.96.0.12' });
    const spec = structuredClone(state.mw.spec);
    lines.length = 0;
    const task = await api.updateLxcConfig('k8s', 'workloads/web', { swap: 512 });
    assert.equal(task, 'k8s:update:workloads/web:2');
    assert.deepEqual(state.mw.spec, spec);
    assert.match(lines.join('\n'), /swap 512 MB is not applied to workloads\/web: Kubernetes has no per-container swap limit/);
    assert.match(lines.join('\n'), /workloads\/web unchanged/);
  });

  /** The workload `web` with env `env` and its Secret, as a create made them. */
  function withEnv(env) {
    const made = m.desired(
      { namespace: 'workloads', nodeId: 7, containerId: 3, hostname: 'web', image: 'nginx', env, services: [{ type: 'http', internalPort: 80 }] },
      m.settingsFromEnv({}),
    );
    state.mw = { ...made.workload, metadata: { ...made.workload.metadata, generation: 2, resourceVersion: '10', uid: 'u-1' } };
    state.mw.status = { observedGeneration: 2, phase: 'Running' };
    state.secret = { ...made.secret, metadata: { ...made.secret.metadata, resourceVersion: '5' } };
    state.conflicts = 0;
    state.failures = 0;
  }
  const secretEnv = () => Object.fromEntries(Object.entries(state.secret.data).map(([k, v]) => [k, Buffer.from(v, 'base64').toString()]));
  const specDigest = () => state.mw.spec.podAnnotations[m.ENV_DIGEST_ANNOTATION];
  const mwPuts = () => state.requests.filter((r) => r.method === 'PUT' && r.url.includes('/managedworkloads/'));

  test("services changed after create: the workload's ports and Service, in one write (one generation)", async () => {
    withEnv({ A: '1' });
    state.requests.length = 0;
    const services = [
      { type: 'http', internalPort: 80 },
      { type: 'transport', internalPort: 22, protocol: 'tcp' },
      { type: 'transport', internalPort: 53, protocol: 'udp' },
      { type: 'dns', internalPort: 53 },
    ];
    const task = await api.updateLxcConfig('k8s', 'workloads/web', { env: 'A=1', services });
    assert.equal(task, 'k8s:update:workloads/web:3');
    assert.equal(mwPuts().length, 1, 'one write');
    assert.deepEqual(state.mw.spec.ports, m.ports(services));
    assert.deepEqual(state.mw.spec.service, { type: 'ClusterIP' });
    assert.equal((await api.lxcConfig('k8s', 'workloads/web')).ports, 'tcp-22,udp-53,http-80', 'lxcConfig shows the change');
    // The same services again: nothing changes; the spec is exactly what a create makes.
    await api.updateLxcConfig('k8s', 'workloads/web', { services });
    assert.equal(state.mw.metadata.generation, 3);
    const { workload: created } = m.desired(
      { namespace: 'workloads', nodeId: 7, containerId: 3, hostname: 'web', image: 'nginx', env: { A: '1' }, services },
      m.settingsFromEnv({}),
    );
    assert.deepEqual(state.mw.spec, created.spec);
    // All deleted: no ports, no Service.
    await api.updateLxcConfig('k8s', 'workloads/web', { services: [] });
    assert.equal(state.mw.metadata.generation, 4);
    assert.ok(!('ports' in state.mw.spec) && !('service' in state.mw.spec), JSON.stringify(state.mw.spec));
  });

  test("the administrator's isolation setting reaches a container at its next reconfigure, and leaves with it", async () => {
    withEnv({ A: '1' });
    assert.ok(!('isolation' in state.mw.spec), 'made before isolation was set');
    const isolating = new KubernetesApi(
      { id: 7, name: 'k8s', kubeNamespace: 'workloads' },
      { kubeconfig, env: { MW_KUBECONFIG_ALLOW_INSECURE_TLS: '1', MW_ISOLATION_ALLOW_FROM: 'cidr:10.0.0.0/24' }, log: () => {} },
    );
    const template = structuredClone(state.mw.spec.podAnnotations);
    await isolating.updateLxcConfig('k8s', 'workloads/web', { cores: 4 });
    assert.deepEqual(state.mw.spec.isolation, { allowFrom: [{ cidr: '10.0.0.0/24' }] });
    assert.deepEqual(state.mw.spec.podAnnotations, template, 'the Pod template is untouched: no rollout for it');
    // The setting removed: the next reconfigure removes it too.
    await api.updateLxcConfig('k8s', 'workloads/web', { cores: 4 });
    assert.ok(!('isolation' in state.mw.spec), JSON.stringify(state.mw.spec));
  });

  test('an env change on a workload whose resourceVersion moved (409): re-read and replaced, Secret and digest agree', async () => {
    withEnv({ A: '1' });
    state.conflicts = 2;
    state.requests.length = 0;
    await api.updateLxcConfig('k8s', 'workloads/web', { env: 'A=2\0B=3' });
    assert.deepEqual(secretEnv(), { A: '2', B: '3' });
    assert.equal(specDigest(), m.envDigest({ A: '2', B: '3' }));
    assert.equal(state.mw.metadata.generation, 3);
    assert.equal(mwPuts().length, 3, 'two conflicts, then the write');
  });

  test('a replace that fails: no half change, the Secret keeps the env the spec\'s digest names', async () => {
    withEnv({ A: '1' });
    state.failures = 1;
    await assert.rejects(api.updateLxcConfig('k8s', 'workloads/web', { env: 'A=2', cores: 2 }), /updating workloads\/web: Kubernetes API 422/);
    assert.deepEqual(secretEnv(), { A: '1' }, 'the old env');
    assert.equal(specDigest(), m.envDigest(secretEnv()));
    assert.equal(state.mw.metadata.generation, 2);
    // Conflicts past the retries fail the same way, consistently.
    state.conflicts = 99;
    await assert.rejects(api.updateLxcConfig('k8s', 'workloads/web', { env: 'A=3' }), /Kubernetes API 409/);
    assert.deepEqual(secretEnv(), { A: '1' });
    assert.equal(specDigest(), m.envDigest(secretEnv()));
    // The same through a retried create job (createLxc on its existing workload).
    withEnv({ A: '1' });
    state.failures = 1;
    await assert.rejects(api.createLxc('k8s', { containerId: 3, hostname: 'web', image: 'nginx', env: 'A=9' }), /Kubernetes API 422/);
    assert.deepEqual(secretEnv(), { A: '1' });
    assert.equal(specDigest(), m.envDigest(secretEnv()));
  });

  test('delete with force and purge (what Manager always passes): the workload only, the disk as MW_ROOTFS_ON_DELETE says', async () => {
    state.mw = workload({ address: '10.96.0.12' });
    state.requests.length = 0;
    await api.deleteContainer('k8s', 'workloads/web', true, true);
    const writes = state.requests.filter((r) => r.method !== 'GET');
    assert.deepEqual(writes.map((r) => `${r.method} ${r.url.split('?')[0]}`), [
      'DELETE /apis/opensource-server.mieweb.org/v1alpha1/namespaces/workloads/managedworkloads/web',
    ]);
    assert.ok(!state.requests.some((r) => r.url.includes('persistentvolumeclaims')), 'no claim touched');
  });
});

test('MW_SERVICE_TYPE=NodePort is refused, saying what to use instead', () => {
  assert.throws(() => m.settingsFromEnv({ MW_SERVICE_TYPE: 'NodePort' }), (err) => {
    assert.ok(err instanceof m.MappingError);
    assert.match(err.message, /^MW_SERVICE_TYPE=NodePort does not fit Manager: its agent dials ipv4Address:internalPort/);
    assert.match(err.message, /Use ClusterIP \(the default\) when the agent runs inside the cluster or on one of its nodes, LoadBalancer .* outside the cluster, or none for the Pod IP/);
    return true;
  });
  assert.throws(() => m.settingsFromEnv({ MW_SERVICE_TYPE: 'External' }), /must be ClusterIP, LoadBalancer or none, not External/);
  for (const t of ['ClusterIP', 'LoadBalancer', 'none', '']) m.settingsFromEnv({ MW_SERVICE_TYPE: t });
});

describe('the Manager patch', () => {
  const patch = fs.readFileSync(PATCH, 'utf8');

  test("every hunk's line counts match its header (git apply refuses the patch otherwise)", () => {
    const lines = patch.split('\n');
    let hunks = 0;
    for (let i = 0; i < lines.length; i++) {
      const h = /^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@/.exec(lines[i]);
      if (!h) continue;
      hunks++;
      let [old, neu] = [Number(h[1] ?? 1), Number(h[2] ?? 1)];
      let j = i + 1;
      for (; old > 0 || neu > 0; j++) {
        const c = lines[j]?.[0];
        if (c === ' ') [old, neu] = [old - 1, neu - 1];
        else if (c === '-') old--;
        else if (c === '+') neu--;
        else if (c !== '\\') assert.fail(`hunk at line ${i + 1} ends early, at line ${j + 1}`);
      }
      assert.ok(old === 0 && neu === 0, `hunk at line ${i + 1}: counts off`);
      assert.ok(j >= lines.length - 1 || /^(@@|diff |\\)/.test(lines[j]), `hunk at line ${i + 1} is longer than its header says (line ${j + 1})`);
    }
    assert.ok(hunks > 10, `${hunks} hunks`);
  });

  /** The lines the patch adds, by file. */
  const addedByFile = () => {
    const files = {};
    let file;
    for (const l of patch.split('\n')) {
      if (l.startsWith('+++ ')) file = l.slice('+++ b/'.length);
      else if (l.startsWith('+')) (files[file] ||= []).push(l.slice(1));
    }
    return files;
  };

  test("no scattered branching: Manager's shared code asks the provider's capabilities, not the node type", () => {
    // The node model (the one place that picks a provider by type), the nodes router (a
    // kubernetes node's own fields), the client's forms and the tests may name the type.
    const allowed = /^create-a-container\/(models\/node\.js|routers\/api\/v1\/nodes\.js|client\/|.*__tests__\/)/;
    for (const [file, lines] of Object.entries(addedByFile())) {
      if (allowed.test(file)) continue;
      for (const l of lines) assert.ok(!/nodeType\b.*['"]kubernetes['"]|isOnKubernetes/.test(l), `${file}: ${l.trim()}`);
    }
    // Each capability it asks is one the provider declares: a misspelt one would be undefined,
    // and a kubernetes node would take Proxmox's path without a word.
    const asked = [...patch.matchAll(/capabilities\(\)\.(\w+)/g)].map((x) => x[1]);
    assert.ok(asked.length >= 4, `asked: ${asked}`);
    for (const name of asked) assert.equal(KubernetesApi.capabilities[name], true, `capabilities().${name}`);
  });

  test('kubeconfigPath: no fallback to $KUBECONFIG; MW_KUBECONFIG_IN_CLUSTER=1 is the only one', () => {
    assert.ok(!patch.includes('$KUBECONFIG'), 'the patch still names $KUBECONFIG as a fallback');
    const added = patch.split('\n').filter((l) => l.startsWith('+'));
    assert.ok(added.some((l) => l.includes('description: kubernetes nodes only; absolute path of a kubeconfig') && l.includes('MW_KUBECONFIG_IN_CLUSTER=1')), 'the OpenAPI description');
    assert.ok(added.some((l) => l.includes('MW_KUBECONFIG_IN_CLUSTER=1') && l.trim().startsWith('+    //')), 'the model comment');
  });

  // The patch's reconfigureByRollout (a kubernetes node's reconfigure job), as Manager runs it,
  // against a provider that changes nothing.
  const source = (() => {
    const start = patch.indexOf('+async function reconfigureByRollout');
    const end = patch.indexOf('\n+}\n', start);
    return patch.slice(start, end + 3).split('\n').map((l) => l.slice(1)).join('\n');
  })();
  const reconfigure = new Function('console', `${source}\nreturn reconfigureByRollout;`);
  async function run(args) {
    const calls = [];
    const client = {
      lxcConfig: async () => ({ hostname: 'web', cores: 2, memory: 2048, swap: 0 }),
      updateLxcConfig: async (n, id, config) => (calls.push(['update', config]), 'k8s:update:workloads/web:2'),
      getLxcStatus: async () => ({ status: 'running' }),
      stopLxc: async () => (calls.push(['stop']), 'k8s:stop:workloads/web:3'),
      startLxc: async () => (calls.push(['start']), 'k8s:start:workloads/web:4'),
      waitForTask: async () => ({ status: 'stopped', exitstatus: 'OK' }),
      getLxcIpAddress: async () => '10.96.0.12',
    };
    const container = { containerId: 'workloads/web', update: async () => {} };
    const out = [];
    await reconfigure({ log: (...a) => out.push(a.join(' ')) })(client, { name: 'k8s' }, container, { env: 'A=1' }, args);
    return { calls, out: out.join('\n') };
  }

  test('an approved swap request (or the same size again) does not restart the container', async () => {
    let r = await run({ swap: '512' });
    assert.deepEqual(r.calls, [['update', { env: 'A=1', swap: 512 }]], 'swap goes to the provider, which says it is not applied');
    assert.match(r.out, /No change to apply: the container keeps running/);
    r = await run({ cpus: '2' });
    assert.deepEqual(r.calls.map((c) => c[0]), ['update']);
  });

  test('a job for a services change alone (--services) never restarts the container', async () => {
    const r = await run({ services: 'changed' });
    assert.deepEqual(r.calls.map((c) => c[0]), ['update']);
  });

  test('a reconfigure that changes nothing else is still a restart (Manager\'s restart)', async () => {
    const r = await run({});
    assert.deepEqual(r.calls.map((c) => c[0]), ['update', 'stop', 'start']);
  });
});
