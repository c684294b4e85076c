// Manager itself, patched, on the operator: hack/manager-e2e.sh starts Manager's server.js and
// job-runner.js (MANAGER_URL) and runs this file. Everything goes through Manager's REST API
// as a user would; the cluster is only read, to check what Manager's jobs made.
'use strict';

const { after, before, describe, test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const m = require('../lib/mapping');
const { Cluster, waitUntil } = require('../testing/cluster');
const { Manager } = require('../testing/manager');

const { MANAGER_URL, MANAGER_LOGS, MW_TEST_KUBECONFIG, MW_E2E_STORAGE_CLASS } = process.env;
if (!MANAGER_URL || !MW_TEST_KUBECONFIG || !MANAGER_LOGS || !MW_E2E_STORAGE_CLASS) {
  console.error('run by hack/manager-e2e.sh (MANAGER_URL, MANAGER_LOGS, MW_TEST_KUBECONFIG, MW_E2E_STORAGE_CLASS)');
  process.exit(2);
}

describe('Manager, patched, runs its containers on Kubernetes', () => {
  const manager = new Manager(MANAGER_URL);
  const cluster = new Cluster(MW_TEST_KUBECONFIG, 't-manager-e2e', { storageClass: MW_E2E_STORAGE_CLASS, capacity: '100Gi' });
  let site;
  let web;
  let lastJob = 0;

  before(async () => {
    await cluster.setUp(3);
    const kubeconfig = path.join(MANAGER_LOGS, 'manager.kubeconfig');
    fs.writeFileSync(kubeconfig, await cluster.managerKubeconfig(), { mode: 0o600 });
    await manager.registerAdmin();
    site = await manager.site('e2e', 0);
    cluster.kubeconfigFile = kubeconfig;
  });
  after(() => cluster.tearDown());

  test('a kubernetes node: accepted, its kubeconfig path never returned', async () => {
    const refused = await manager.call('POST', `/sites/${site.id}/nodes`, { name: 'k8s', nodeType: 'kubernetes' });
    assert.equal(refused.status, 400);
    assert.equal(refused.body.error.code, 'invalid_kube_namespace');
    assert.deepEqual(Object.keys(refused.body.error.fields), ['kubeNamespace'], 'the refusal names its field');
    // Checked with the cluster before it is saved: a namespace Manager's identity is not bound
    // in is refused on its field, in the API server's words; so is a kubeconfig that is not there.
    const elsewhere = await manager.call('POST', `/sites/${site.id}/nodes`, {
      name: 'k8s',
      nodeType: 'kubernetes',
      kubeconfigPath: cluster.kubeconfigFile,
      kubeNamespace: 'default',
    });
    assert.equal(elsewhere.status, 400);
    assert.equal(elsewhere.body.error.code, 'kube_forbidden');
    assert.match(elsewhere.body.error.fields.kubeNamespace, /Kubernetes API 403: .*cannot list resource "managedworkloads"/);
    const missing = await manager.call('POST', `/sites/${site.id}/nodes`, {
      name: 'k8s',
      nodeType: 'kubernetes',
      kubeconfigPath: `${cluster.kubeconfigFile}.missing`,
      kubeNamespace: cluster.namespace,
    });
    assert.equal(missing.status, 400);
    assert.deepEqual([missing.body.error.code, Object.keys(missing.body.error.fields)], ['invalid_kubeconfig', ['kubeconfigPath']]);
    assert.match(missing.body.error.message, /file not readable: ENOENT$/);
    const node = await manager.ok('POST', `/sites/${site.id}/nodes`, {
      name: 'k8s',
      nodeType: 'kubernetes',
      kubeconfigPath: cluster.kubeconfigFile,
      kubeNamespace: cluster.namespace,
    });
    assert.equal(node.nodeType, 'kubernetes');
    assert.equal(node.hasKubeconfig, true);
    assert.ok(!('kubeconfigPath' in node), 'kubeconfigPath is not returned');
    assert.equal(node.kubeNamespace, cluster.namespace);
    const listed = await manager.ok('GET', `/sites/${site.id}/nodes`);
    assert.ok(!JSON.stringify(listed).includes(cluster.kubeconfigFile));
    cluster.nodeId = node.id;
  });

  test('create: job → workload → running, with the address and provider id stored', async () => {
    const made = await manager.ok('POST', `/sites/${site.id}/containers`, {
      hostname: 'web',
      template: 'custom',
      customTemplate: 'docker.io/library/nginx:latest',
      environmentVars: [
        { key: 'GREETING', value: 'hello' },
        { key: 'API_TOKEN', value: 't0p-s3cret' },
      ],
      entrypoint: `nginx -g 'daemon off;'`,
      services: { 0: { type: 'tcp', internalPort: 22 } },
    });
    assert.equal(made.status, 'creating');
    lastJob = made.jobId;
    // What Manager shows while its job runs: creating, then running; never unknown or missing.
    const seen = new Set();
    await waitUntil(
      'Manager to show it running',
      async () => (await manager.ok('GET', `/sites/${site.id}/containers/${made.containerId}`)).status,
      (status) => seen.add(status) && status === 'running',
      120_000,
    );
    assert.deepEqual([...seen], ['creating', 'running']);
    const job = await manager.succeeds(made.jobId);
    assert.match(job.output, /Container provider ID .*\/web stored/);

    web = await manager.ok('GET', `/sites/${site.id}/containers/${made.containerId}`);
    const mw = await cluster.workload('web');
    assert.equal(web.status, 'running');
    assert.equal(web.containerId, `${cluster.namespace}/web`);
    assert.equal(web.ipv4Address, mw.status.address);
    assert.equal(web.macAddress, null);
    assert.equal(mw.status.phase, 'Running');
    assert.deepEqual(mw.spec.command, ['nginx', '-g', 'daemon off;']);
    assert.equal(mw.metadata.labels[m.NODE_ID_LABEL], String(cluster.nodeId));
    assert.equal(mw.metadata.labels[m.CONTAINER_ID_LABEL], String(made.containerId));
    assert.deepEqual(mw.spec.ports, [{ containerPort: 22, name: 'tcp-22', protocol: 'TCP' }]);
    assert.equal(mw.spec.volumes[0].size, `${m.DEFAULT_ROOTFS_GB}Gi`, "Manager's default disk");
    assert.ok(!JSON.stringify(mw).includes('t0p-s3cret'), 'env values are not in the CR');
    const secret = await cluster.secret('web-manager-env');
    assert.equal(Buffer.from(secret.data.API_TOKEN, 'base64').toString(), 't0p-s3cret');
    // Manager's list shows it too (one clusterResources call per node).
    const list = await manager.ok('GET', `/sites/${site.id}/containers`);
    assert.deepEqual(list.map((c) => [c.hostname, c.status]), [['web', 'running']]);
  });

  test('the node API: a nodeType change under containers refused on its field; the hand-back of docs/manager.md accepted', async () => {
    const nodes = `/sites/${site.id}/nodes`;
    const refused = await manager.call('PUT', `${nodes}/${cluster.nodeId}`, { name: 'k8s', nodeType: 'dummy' });
    assert.equal(refused.status, 400, JSON.stringify(refused.body));
    assert.equal(refused.body.error.code, 'node_type_in_use');
    assert.deepEqual(Object.keys(refused.body.error.fields), ['nodeType']);
    assert.match(refused.body.error.fields.nodeType, /1 container\(s\) still run on node k8s/);
    let node = (await manager.ok('GET', nodes)).find((n) => n.id === cluster.nodeId);
    assert.equal(node.nodeType, 'kubernetes');
    assert.equal(node.kubeNamespace, cluster.namespace, 'the connection fields are kept');
    assert.equal(node.hasKubeconfig, true);

    // A node without containers: handed back (kubeNamespace: null), then its type changed.
    const spare = await manager.ok('POST', nodes, {
      name: 'k8s-spare',
      nodeType: 'kubernetes',
      kubeconfigPath: cluster.kubeconfigFile,
      kubeNamespace: cluster.namespace,
    });
    const blank = await manager.call('PUT', `${nodes}/${spare.id}`, { name: 'k8s-spare', nodeType: 'kubernetes', kubeNamespace: '' });
    assert.equal(blank.status, 400, 'an empty namespace is still a mistake on the form');
    assert.deepEqual(Object.keys(blank.body.error.fields), ['kubeNamespace']);
    node = await manager.ok('PUT', `${nodes}/${spare.id}`, { name: 'k8s-spare', nodeType: 'kubernetes', kubeNamespace: null });
    assert.equal(node.kubeNamespace, null, 'handed back: no namespace');
    assert.equal(node.hasKubeconfig, true, 'the other fields stay');
    node = await manager.ok('PUT', `${nodes}/${spare.id}`, { name: 'k8s-spare', nodeType: 'dummy' });
    assert.equal(node.nodeType, 'dummy');
    assert.equal(node.hasKubeconfig, false, 'leaving kubernetes clears the connection fields');
    const gone = await manager.call('DELETE', `${nodes}/${spare.id}`);
    assert.equal(gone.status, 204);
  });

  test('env change and resources: a rollout each, the same disk', async () => {
    const claim = await waitUntil('the rootfs claim to be Bound', () => cluster.claim('web-rootfs'), (c) => c?.status?.phase === 'Bound');
    const before = await cluster.workload('web');
    const podsBefore = (await cluster.pods('web')).map((p) => p.metadata.uid);
    const put = await manager.ok('PUT', `/sites/${site.id}/containers/${web.id}`, {
      environmentVars: [{ key: 'GREETING', value: 'bonjour' }],
      entrypoint: `nginx -g 'daemon off;'`,
    });
    assert.ok(put.jobId, 'a reconfigure job');
    lastJob = put.jobId;
    await manager.succeeds(put.jobId);
    const after = await cluster.workload('web');
    assert.equal(after.metadata.generation, before.metadata.generation + 1, 'one change, one rollout');
    assert.equal(after.status.phase, 'Running');
    const secret = await cluster.secret('web-manager-env');
    const env = Object.fromEntries(Object.entries(secret.data).map(([k, v]) => [k, Buffer.from(v, 'base64').toString()]));
    assert.equal(env.GREETING, 'bonjour');
    assert.ok(!('API_TOKEN' in env), 'API_TOKEN removed: the whole env is replaced');
    // The effective env: Manager's seeded system defaults are merged in, as on Proxmox.
    assert.ok('WAZUH_MANAGER' in env && 'SSSD_LDAP_URI' in env, `system defaults: ${Object.keys(env)}`);
    assert.ok((await cluster.pods('web')).every((p) => !podsBefore.includes(p.metadata.uid)), 'new Pods');

    // Memory through a resource request (an administrator's is approved at once), then disk.
    await manager.ok('POST', '/resource-requests', { siteId: site.id, hostname: 'web', resourceType: 'memory', value: 1024 });
    lastJob += 1;
    const memJob = await manager.succeeds(lastJob);
    assert.match(memJob.command, /--memory=1024/);
    let mw = await cluster.workload('web');
    assert.equal(mw.spec.resources.limits.memory, '1024Mi');
    assert.equal(mw.status.phase, 'Running');
    await manager.ok('POST', '/resource-requests', { siteId: site.id, hostname: 'web', resourceType: 'rootfs', value: m.DEFAULT_ROOTFS_GB + 1 });
    lastJob += 1;
    await manager.succeeds(lastJob);
    mw = await cluster.workload('web');
    assert.equal(mw.spec.volumes[0].size, `${m.DEFAULT_ROOTFS_GB + 1}Gi`);
    const grown = await cluster.claim('web-rootfs');
    assert.equal(grown.metadata.uid, claim.metadata.uid, 'the same disk');
    assert.equal(grown.spec.resources.requests.storage, `${m.DEFAULT_ROOTFS_GB + 1}Gi`);
    const now = await manager.ok('GET', `/sites/${site.id}/containers/${web.id}`);
    assert.equal(now.status, 'running');
    assert.equal(now.ipv4Address, mw.status.address, 'the Service’s address, unchanged by rollouts');
  });

  test('a service added after create, then deleted: each a reconfigure job, one rollout, no restart', async () => {
    const route = `/sites/${site.id}/containers/${web.id}`;
    // What the edit form sends: the container's env and entrypoint as they are, and the change.
    const same = { environmentVars: [{ key: 'GREETING', value: 'bonjour' }], entrypoint: `nginx -g 'daemon off;'` };
    let before = await cluster.workload('web');
    let put = await manager.ok('PUT', route, { ...same, services: { 0: { type: 'tcp', internalPort: 8080 } } });
    assert.ok(put.jobId, 'a reconfigure job for the new port');
    let job = await manager.succeeds(put.jobId);
    assert.doesNotMatch(job.output, /No change: restarting/);
    let mw = await cluster.workload('web');
    assert.equal(mw.metadata.generation, before.metadata.generation + 1, 'one change, one rollout');
    assert.deepEqual(mw.spec.ports.map((p) => p.name), ['tcp-22', 'tcp-8080']);
    assert.equal(mw.status.phase, 'Running');
    let now = await manager.ok('GET', route);
    assert.equal(now.ipv4Address, mw.status.address);

    const added = now.services.find((s) => s.internalPort === 8080);
    assert.ok(added, JSON.stringify(now.services));
    before = mw;
    put = await manager.ok('PUT', route, { ...same, services: { 0: { id: added.id, deleted: true } } });
    assert.ok(put.jobId, 'a reconfigure job for the deleted port');
    job = await manager.succeeds(put.jobId);
    lastJob = put.jobId;
    mw = await cluster.workload('web');
    assert.equal(mw.metadata.generation, before.metadata.generation + 1);
    assert.deepEqual(mw.spec.ports.map((p) => p.name), ['tcp-22']);
  });

  test('stop and start: Manager’s restart', async () => {
    const podsBefore = (await cluster.pods('web')).map((p) => p.metadata.uid);
    const put = await manager.ok('PUT', `/sites/${site.id}/containers/${web.id}`, { restart: true });
    lastJob = put.jobId;
    const job = await manager.succeeds(put.jobId);
    assert.match(job.output, /No change: restarting/);
    assert.match(job.output, /web Stopped/);
    assert.match(job.output, /web Running/);
    const pods = await cluster.pods('web');
    assert.equal(pods.length, 1);
    assert.ok(!podsBefore.includes(pods[0].metadata.uid), 'a new Pod');
    assert.equal((await manager.ok('GET', `/sites/${site.id}/containers/${web.id}`)).status, 'running');
  });

  test('a bad image: failed in Manager, the reason in the job’s output', async () => {
    const made = await manager.ok('POST', `/sites/${site.id}/containers`, {
      hostname: 'broken',
      template: 'custom',
      // Manager stores it as kwok.example/library/image-pull-backoff:latest, which kwok
      // (hack/kwok/stages.yaml) never lets pull.
      customTemplate: 'kwok.example/image-pull-backoff',
    });
    lastJob = made.jobId;
    const job = await manager.job(made.jobId);
    assert.equal(job.status, 'failure');
    assert.match(job.output, /broken failed: ImagePullBackOff/);
    const broken = await manager.ok('GET', `/sites/${site.id}/containers/${made.containerId}`);
    assert.equal(broken.status, 'failed');
    assert.equal(broken.failureJobId, made.jobId, 'the job that says why: its create');
    assert.equal(broken.containerId, `${cluster.namespace}/broken`, 'stored as soon as the workload existed');
    await manager.ok('DELETE', `/sites/${site.id}/containers/${made.containerId}`);
    assert.equal(await cluster.workload('broken'), null);
  });

  test('delete: the workload goes, the disk stays (Retain)', async () => {
    const claim = await cluster.claim('web-rootfs');
    await manager.ok('DELETE', `/sites/${site.id}/containers/${web.id}`);
    assert.equal(await cluster.workload('web'), null);
    await waitUntil('the env Secret to go', () => cluster.secret('web-manager-env'), (s) => s === null);
    assert.equal((await cluster.claim('web-rootfs')).metadata.uid, claim.metadata.uid, 'retained');
    assert.deepEqual(await manager.ok('GET', `/sites/${site.id}/containers`), []);
  });

  // The same lifecycle on the real node (kubelet, containerd, runc; hack/realnode.sh), with a
  // local image that answers HTTP: what Manager stored as the address is where it answers.
  // Its node reaches the cluster through a kubeconfig whose current context is a decoy, so
  // it works only because Manager passes the node's kubeContext.
  const realNode = process.env.MW_TEST_REAL_NODE === '1';
  test(
    'on the real node, through kubeContext: a local image answers HTTP at the address Manager stored',
    { skip: !realNode && 'needs the real node (MW_TEST_REAL_NODE=1; make test starts it)' },
    async () => {
      const real = new Cluster(MW_TEST_KUBECONFIG, 't-manager-real', { storageClass: MW_E2E_STORAGE_CLASS, capacity: '100Gi', realNode: true });
      try {
        await real.setUp(1);
        const kubeconfig = path.join(MANAGER_LOGS, 'manager-real.kubeconfig');
        fs.writeFileSync(kubeconfig, await real.managerKubeconfig({ context: 'real-node' }), { mode: 0o600 });
        const realSite = await manager.site('e2e-real', 1);
        await manager.ok('POST', `/sites/${realSite.id}/nodes`, {
          name: 'k8s-real',
          nodeType: 'kubernetes',
          kubeconfigPath: kubeconfig,
          kubeContext: 'real-node',
          kubeNamespace: real.namespace,
        });
        const made = await manager.ok('POST', `/sites/${realSite.id}/containers`, {
          hostname: 'site',
          template: 'custom',
          customTemplate: 'mw-test.invalid/httpd:1',
          services: { 0: { type: 'tcp', internalPort: 8080 } },
        });
        await manager.succeeds(made.jobId);
        const container = await manager.ok('GET', `/sites/${realSite.id}/containers/${made.containerId}`);
        assert.equal(container.status, 'running');
        assert.equal(container.containerId, `${real.namespace}/site`);
        const pods = await real.pods('site');
        assert.equal(pods.length, 1);
        assert.equal(pods[0].spec.nodeName, 'mw-real-node');
        const mw = await real.workload('site');
        assert.equal(container.ipv4Address, mw.status.address);
        // kube-proxy on the real node routes this host's connection to the Service's address.
        const body = await waitUntil(
          `http://${container.ipv4Address}:8080/ to answer`,
          () => fetch(`http://${container.ipv4Address}:8080/`, { signal: AbortSignal.timeout(3000) }).then((r) => r.text(), (e) => String(e)),
          (text) => text.trim() === 'mw-test httpd v1',
          30_000,
        );
        assert.equal(body.trim(), 'mw-test httpd v1');
        assert.equal(container.failureJobId, null, 'none while it runs');

        // An edit that breaks it (its entrypoint exits at once): Manager shows it failed, and
        // the job whose output says why is that reconfigure, not the create that went well.
        const route = `/sites/${realSite.id}/containers/${made.containerId}`;
        const edit = await manager.ok('PUT', route, { entrypoint: `/bin/sh -c 'echo broken; exit 3'` });
        const job = await manager.job(edit.jobId, 180_000);
        assert.equal(job.status, 'failure', job.output);
        const failed = await waitUntil('failed in Manager', () => manager.ok('GET', route), (c) => c.status === 'failed', 60_000);
        assert.equal(failed.failureJobId, edit.jobId);
        await manager.ok('DELETE', `/sites/${realSite.id}/containers/${made.containerId}`);
        assert.equal(await real.workload('site'), null);
      } finally {
        await real.tearDown();
      }
    },
  );
});
