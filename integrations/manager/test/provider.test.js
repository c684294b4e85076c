// The provider against the local control plane and the operator (hack/test.sh sets
// MW_TEST_KUBECONFIG, the admin kubeconfig; the operator runs). Every call is made as Manager's
// identity: a ServiceAccount bound to rbac/role.yaml and nothing else.
'use strict';

const { after, before, describe, test } = require('node:test');
const assert = require('node:assert/strict');

const k8s = require('@kubernetes/client-node');

const { KubernetesApi, checkNode } = require('..');
const m = require('../lib/mapping');
const { Cluster, waitUntil } = require('../testing/cluster');
const { table, managerCall } = require('../testing/cases');

const kubeconfigPath = process.env.MW_TEST_KUBECONFIG;
if (!kubeconfigPath) {
  // Not a pass: the cluster half of the suite did not run.
  console.error('MW_TEST_KUBECONFIG is not set (hack/test.sh sets it): the provider was not tested against a cluster');
  process.exit(2);
}

/** Wait until `read()`'s managerStatus words are `words`. */
const shown = (what, read, words) =>
  waitUntil(`clusterResources to show ${what}`, async () => (await read()).map((r) => r.managerStatus), (got) => JSON.stringify(got) === JSON.stringify(words), 10_000);

// Manager's own rootfs regex (bin/create-container.js parseRootfsSizeGb).
const rootfsSizeGb = (rootfs) => Number(/size=(\d+(?:\.\d+)?)([TGMK])?/i.exec(rootfs)[1]);

describe('KubernetesApi as Manager calls it', () => {
  const cluster = new Cluster(kubeconfigPath, 't-manager-provider');
  const node = { id: 11, name: 'k8s-a' };
  let api;
  let apiFor;
  const lines = [];

  before(async () => {
    await cluster.setUp(4);
    const kubeconfig = await cluster.managerKubeconfig();
    const settings = { ...m.settingsFromEnv({ MW_ROOTFS_STORAGE_CLASS: cluster.class }) };
    apiFor = (n, s = settings) => new KubernetesApi({ ...n, kubeNamespace: cluster.namespace }, { kubeconfig, settings: s, log: (l) => lines.push(l) });
    api = apiFor(node);
  });
  after(() => cluster.tearDown());

  const create = (hostname, extra = {}) =>
    api.createLxc(node.name, {
      containerId: 101,
      hostname,
      image: 'docker.io/library/nginx:latest',
      entrypoint: "/bin/sh -c 'exec nginx -g \"daemon off;\"'",
      env: 'GREETING=hello\0DB_PASSWORD=s3cr3t-value',
      cores: 2,
      memory: 512,
      rootfs: 1,
      tags: 'alice',
      services: [{ type: 'http', internalPort: 80 }, { type: 'transport', internalPort: 22, protocol: 'tcp' }],
      ...extra,
    });

  test('create → Running; the shapes Manager reads back; env only in the Secret', async () => {
    const task = await create('web');
    assert.match(task, new RegExp(`^k8s:create:${cluster.namespace}/web:1$`));
    const providerId = api.providerId('web');
    assert.equal(providerId, `${cluster.namespace}/web`);
    const done = await api.waitForTask(node.name, task, 200, 60_000);
    assert.equal(done.exitstatus, 'OK');

    const mw = await cluster.workload('web');
    assert.equal(mw.status.phase, 'Running');
    assert.ok(!JSON.stringify(mw).includes('s3cr3t-value'), 'no env value in the CR');
    assert.deepEqual(mw.spec.env.map((e) => e.valueFrom.secretKeyRef), [
      { name: 'web-manager-env', key: 'DB_PASSWORD' },
      { name: 'web-manager-env', key: 'GREETING' },
    ]);
    const secret = await cluster.secret('web-manager-env');
    assert.equal(Buffer.from(secret.data.DB_PASSWORD, 'base64').toString(), 's3cr3t-value');
    assert.deepEqual(secret.metadata.ownerReferences.map((o) => o.uid), [mw.metadata.uid], 'goes with the workload');
    assert.equal(mw.metadata.labels[m.PROVIDER_LABEL], 'manager');
    assert.equal(mw.metadata.labels[m.SYNCED_BY_LABEL], undefined, 'never the bridge’s label');

    assert.equal(await api.getLxcIpAddress(node.name, providerId), mw.status.address);
    assert.ok(mw.status.address, 'an address (the Service’s)');
    assert.equal(await api.getLxcMacAddress(node.name, providerId), null);
    const config = await api.lxcConfig(node.name, providerId);
    assert.equal(config.hostname, 'web');
    assert.equal(config.cores, 2);
    assert.equal(config.memory, 512);
    assert.equal(rootfsSizeGb(config.rootfs), 1);
    assert.equal(config.env, 'DB_PASSWORD=s3cr3t-value\0GREETING=hello');
    assert.deepEqual(m.shellSplit(config.entrypoint), ['/bin/sh', '-c', 'exec nginx -g "daemon off;"']);
    assert.equal((await api.getLxcStatus(node.name, providerId)).status, 'running');

    const listed = await api.clusterResources('lxc');
    assert.deepEqual(
      listed.map((r) => [r.vmid, r.status, r.managerStatus]),
      [[providerId, 'running', 'running']],
    );
    assert.deepEqual(await api.clusterResources('qemu'), []);
    assert.deepEqual(await apiFor({ id: 12, name: 'k8s-b' }).clusterResources('lxc'), [], 'another node’s list is its own');
    // A retried create job finds its workload: nothing changes.
    assert.equal(await create('web'), task);
    await assert.rejects(create('web', { containerId: 102 }), /belongs to container 101/);
  });

  test('reconfigure: env with delete, entrypoint, resources and disk growth roll out over the same claim', async () => {
    const providerId = api.providerId('web');
    const claim = await waitUntil('the claim to be Bound', () => cluster.claim('web-rootfs'), (c) => c?.status?.phase === 'Bound');
    const before = await cluster.workload('web');
    const podsBefore = (await cluster.pods('web')).map((p) => p.metadata.uid);

    const task = await api.updateLxcConfig(node.name, providerId, { env: 'GREETING=bonjour', entrypoint: 'nginx -g "daemon off;"' });
    await api.waitForTask(node.name, task, 200, 60_000);
    let mw = await cluster.workload('web');
    assert.equal(mw.metadata.generation, before.metadata.generation + 1, 'one change, one generation');
    assert.notEqual(mw.spec.podAnnotations[m.ENV_DIGEST_ANNOTATION], before.spec.podAnnotations[m.ENV_DIGEST_ANNOTATION]);
    assert.deepEqual(mw.spec.command, ['nginx', '-g', 'daemon off;']);
    let config = await api.lxcConfig(node.name, providerId);
    assert.equal(config.env, 'GREETING=bonjour', 'the whole env replaced: DB_PASSWORD is gone');
    const podsAfter = (await cluster.pods('web')).map((p) => p.metadata.uid);
    assert.ok(podsAfter.every((uid) => !podsBefore.includes(uid)), 'a rollout: new Pods');

    // Manager's `delete` unsets them.
    await api.waitForTask(node.name, await api.updateLxcConfig(node.name, providerId, { delete: 'env,entrypoint' }), 200, 60_000);
    mw = await cluster.workload('web');
    assert.equal(mw.spec.env, undefined);
    assert.equal(mw.spec.command, undefined);
    config = await api.lxcConfig(node.name, providerId);
    assert.equal(config.env, undefined);
    assert.equal(config.entrypoint, undefined);

    // Resources and disk as reconfigure-container.js sends them.
    const grown = await api.updateLxcConfig(node.name, providerId, { cores: 1, memory: 256, swap: 0, rootfs: 'local-lvm:2' });
    await api.waitForTask(node.name, grown, 200, 60_000);
    config = await api.lxcConfig(node.name, providerId);
    assert.deepEqual([config.cores, config.memory, rootfsSizeGb(config.rootfs)], [1, 256, 2]);
    const claimAfter = await cluster.claim('web-rootfs');
    assert.equal(claimAfter.metadata.uid, claim.metadata.uid, 'the same disk');
    assert.equal(claimAfter.spec.resources.requests.storage, '2Gi', 'grown in place');
    await assert.rejects(api.updateLxcConfig(node.name, providerId, { rootfs: 'local-lvm:1' }), /never shrink|shrink/);

    // The owner (a reassignment) is metadata: no generation, no rollout.
    const gen = (await cluster.workload('web')).metadata.generation;
    await api.updateLxcConfig(node.name, providerId, { tags: 'bob' });
    mw = await cluster.workload('web');
    assert.equal(mw.metadata.generation, gen);
    assert.equal(mw.metadata.annotations[m.OWNER_ANNOTATION], 'bob');
  });

  test('stop and start', async () => {
    const providerId = api.providerId('web');
    await api.waitForTask(node.name, await api.stopLxc(node.name, providerId), 200, 60_000);
    assert.equal((await api.getLxcStatus(node.name, providerId)).status, 'stopped');
    assert.equal(await api.getLxcIpAddress(node.name, providerId), null);
    // Manager's pages read clusterResources from the node's table, which the watch brings up to
    // date a moment after the write waitForTask saw.
    await shown('offline', () => api.clusterResources('lxc'), ['offline']);
    assert.deepEqual(await cluster.pods('web'), []);
    await api.waitForTask(node.name, await api.startLxc(node.name, providerId), 200, 60_000);
    assert.equal((await api.getLxcStatus(node.name, providerId)).status, 'running');
    await shown('running', () => api.clusterResources('lxc'), ['running']);
  });

  test('waitForTask fails with the workload’s reason, never a bare timeout', async () => {
    // A bad image: Failed at once, with the operator's reason.
    const bad = await create('bad-image', { containerId: 103, image: 'kwok.example/image-pull-backoff', services: [] });
    await assert.rejects(api.waitForTask(node.name, bad, 200, 60_000), (err) => {
      assert.equal(err.reason, 'ImagePullBackOff');
      assert.match(err.message, /bad-image failed: ImagePullBackOff/);
      return true;
    });
    await waitUntil(
      'clusterResources to show it failed',
      async () => (await api.clusterResources('lxc')).filter((r) => r.name === 'bad-image').map((r) => [r.managerStatus, r.reason]),
      (rows) => JSON.stringify(rows) === JSON.stringify([['failed', 'ImagePullBackOff']]),
      10_000,
    );
    // No node can host it: a wait, and the limit says what it waits on.
    const huge = await create('huge', { containerId: 104, cores: 5000, services: [] });
    await assert.rejects(api.waitForTask(node.name, huge, 200, 8_000), (err) => {
      assert.equal(err.reason, 'Unschedulable');
      assert.match(err.message, /not ready after 8000 ms: Creating: Unschedulable: .*Insufficient cpu/);
      return true;
    });
    // A claim no volume can satisfy: it waits, named.
    const noDisk = apiFor(node, m.settingsFromEnv({ MW_ROOTFS_STORAGE_CLASS: 'no-such-class' }));
    const pending = await noDisk.createLxc(node.name, { containerId: 105, hostname: 'no-disk', image: 'docker.io/library/nginx:latest', rootfs: 1 });
    await assert.rejects(noDisk.waitForTask(node.name, pending, 200, 8_000), (err) => {
      assert.equal(err.reason, 'ClaimPending');
      assert.match(err.message, /ClaimPending: .*no-disk-rootfs/);
      return true;
    });
    for (const name of ['bad-image', 'huge', 'no-disk']) await api.deleteContainer(node.name, api.providerId(name), true, true);
  });

  test('the bridge’s workloads are never touched', async () => {
    // What the bridge makes: its own label, no provider label.
    const { workload } = m.desired(
      { namespace: cluster.namespace, nodeId: node.id, containerId: 201, hostname: 'bridged', image: 'docker.io/library/nginx:latest' },
      api.settings,
    );
    delete workload.metadata.labels[m.PROVIDER_LABEL];
    workload.metadata.labels[m.SYNCED_BY_LABEL] = 'mw-bridge';
    await cluster.custom.createNamespacedCustomObject({ group: m.GROUP, version: m.VERSION, plural: m.PLURAL, namespace: cluster.namespace, body: workload });
    const id = api.providerId('bridged');
    for (const call of [
      () => api.updateLxcConfig(node.name, id, { env: 'A=1' }),
      () => api.stopLxc(node.name, id),
      () => api.deleteContainer(node.name, id, true, true),
      () => create('bridged', { containerId: 201 }),
    ]) {
      await assert.rejects(call(), /served by the bridge/);
    }
    const after = await cluster.workload('bridged');
    assert.equal(after.metadata.generation, 1, 'unchanged');
    assert.equal(await cluster.secret('bridged-manager-env'), null, 'no Secret written for it');
    // Not listed as Manager's (and the containers the test before deleted gone from the table).
    await waitUntil('clusterResources to list web alone', async () => (await api.clusterResources('lxc')).map((r) => r.name), (names) => names.join() === 'web', 10_000);
  });

  test('a node moved from the bridge: the same workload, no new generation, no rollout', async () => {
    // What the bridge makes for this container: the shared table's case, which cargo test
    // checks against the bridge's own mapping.
    const c = table.cases.find((x) => x.name.startsWith('no volume and no Service'));
    const moved = { id: c.row.nodeId, name: 'k8s-moved' };
    const mapi = apiFor(moved, c.context);
    const bridgeLabels = { ...c.expect.labels, [m.SYNCED_BY_LABEL]: 'mw-bridge' };
    const namespace = cluster.namespace;
    await cluster.core.createNamespacedSecret({
      namespace,
      body: { metadata: { name: c.expect.secretName, labels: bridgeLabels }, data: {} },
    });
    await cluster.custom.createNamespacedCustomObject({
      group: m.GROUP, version: m.VERSION, plural: m.PLURAL, namespace,
      body: { apiVersion: `${m.GROUP}/${m.VERSION}`, kind: m.KIND, metadata: { name: c.row.hostname, labels: bridgeLabels }, spec: c.expect.spec },
    });
    const running = await waitUntil('the bridge-made workload to run', () => cluster.workload(c.row.hostname), (w) => w?.status?.phase === 'Running');
    const pods = (await cluster.pods(c.row.hostname)).map((p) => p.metadata.uid);
    const deployment = await cluster.apps.readNamespacedDeployment({ name: c.row.hostname, namespace });

    // Served by the bridge: refused. Then handed over as docs/manager.md says (labels only).
    await assert.rejects(mapi.stopLxc(moved.name, mapi.providerId(c.row.hostname)), /served by the bridge/);
    const relabel = { metadata: { labels: { [m.SYNCED_BY_LABEL]: null, [m.PROVIDER_LABEL]: m.PROVIDER_VALUE } } };
    const merge = k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch);
    await cluster.custom.patchNamespacedCustomObject({ group: m.GROUP, version: m.VERSION, plural: m.PLURAL, namespace, name: c.row.hostname, body: relabel }, merge);
    await cluster.core.patchNamespacedSecret({ name: c.expect.secretName, namespace, body: relabel }, merge);

    // Manager's create job for the same container (a retried one) finds it identical.
    const task = await mapi.createLxc(moved.name, managerCall(c));
    await mapi.waitForTask(moved.name, task, 200, 60_000);
    const after = await cluster.workload(c.row.hostname);
    assert.equal(after.metadata.generation, running.metadata.generation, 'no new generation');
    const deploymentAfter = await cluster.apps.readNamespacedDeployment({ name: c.row.hostname, namespace });
    assert.equal(deploymentAfter.metadata.generation, deployment.metadata.generation, 'no rollout');
    assert.deepEqual((await cluster.pods(c.row.hostname)).map((p) => p.metadata.uid), pods, 'the same Pod');
    // And Manager's jobs serve it from now on.
    await mapi.waitForTask(moved.name, await mapi.stopLxc(moved.name, mapi.providerId(c.row.hostname)), 200, 60_000);
    assert.deepEqual((await mapi.clusterResources('lxc')).map((r) => [r.name, r.managerStatus]), [[c.row.hostname, 'offline']]);
    await mapi.deleteContainer(moved.name, mapi.providerId(c.row.hostname));
  });

  test('delete: the workload goes, the disk stays (Retain)', async () => {
    const providerId = api.providerId('web');
    const claim = await cluster.claim('web-rootfs');
    const config = await api.lxcConfig(node.name, providerId);
    assert.equal(config.hostname, 'web', 'what the delete route checks');
    await api.deleteContainer(node.name, providerId, true, true);
    assert.equal(await cluster.workload('web'), null);
    await waitUntil('the env Secret to go with it', () => cluster.secret('web-manager-env'), (s) => s === null);
    assert.equal((await cluster.claim('web-rootfs')).metadata.uid, claim.metadata.uid, 'retained');
    // Deleting again is not an error (a retried request).
    await api.deleteContainer(node.name, providerId, true, true);
    assert.ok(lines.some((l) => l.includes('Running')), 'progress went to the job output');
  });
});

describe("checkNode (Manager's nodes API asks it before saving a kubernetes node), against the cluster", () => {
  const cluster = new Cluster(kubeconfigPath, 't-manager-check');
  let kubeconfig;
  const node = (extra = {}) => ({ name: 'k8s', kubeNamespace: cluster.namespace, ...extra });
  /** The NodeCheckError checkNode rejects with; never one that quotes the token. */
  const refusal = async (n, opts) => {
    const err = await checkNode(n, opts).then(() => assert.fail('accepted'), (e) => e);
    assert.equal(err.name, 'NodeCheckError', err.stack);
    const token = /token: (\S+)/.exec(kubeconfig)[1];
    assert.ok(!err.message.includes(token), err.message);
    return err;
  };

  before(async () => {
    await cluster.setUp(0);
    kubeconfig = await cluster.managerKubeconfig();
  });
  after(() => cluster.tearDown());

  test("Manager's identity, rbac/role.yaml bound in the node's namespace: accepted", async () => {
    await checkNode(node(), { kubeconfig });
  });

  test('a namespace it is not bound in, or one that does not exist: kubeNamespace, in the API server’s words', async () => {
    for (const ns of ['default', `${cluster.namespace}-none`]) {
      const err = await refusal(node({ kubeNamespace: ns }), { kubeconfig });
      assert.deepEqual([err.code, err.field], ['kube_forbidden', 'kubeNamespace']);
      assert.match(err.message, new RegExp(`Kubernetes API 403: .*cannot list resource "managedworkloads" .* in the namespace "${ns}"`));
    }
  });

  test('no such namespace, to an identity allowed in every namespace (the admin): kube_namespace_not_found', async () => {
    const err = await refusal(node({ kubeconfigPath, kubeNamespace: `${cluster.namespace}-none` }));
    assert.deepEqual([err.code, err.field], ['kube_namespace_not_found', 'kubeNamespace']);
    assert.match(err.message, /Kubernetes API 404: namespaces "\S+-none" not found$/);
  });

  test('a token the API server does not accept: kubeconfigPath, 401', async () => {
    const err = await refusal(node(), { kubeconfig: kubeconfig.replace(/token: \S+/, 'token: not-a-token-it-issued') });
    assert.deepEqual([err.code, err.field], ['kube_unauthorized', 'kubeconfigPath']);
    assert.match(err.message, /Kubernetes API 401: Unauthorized$/);
  });

  test('a Role short of rbac/role.yaml: kubeNamespace, each missing permission named', async () => {
    const role = await cluster.rbac.readNamespacedRole({ name: 'manager', namespace: cluster.namespace });
    role.rules = role.rules.map((r) => ({ ...r, verbs: r.verbs.filter((v) => v !== 'delete' && v !== 'update') }));
    await cluster.rbac.replaceNamespacedRole({ name: 'manager', namespace: cluster.namespace, body: role });
    // RBAC serves from an informer: the change is seen within moments.
    const err = await waitUntil('the narrower Role to be seen', () => checkNode(node(), { kubeconfig }).then(() => null, (e) => e), Boolean);
    assert.deepEqual([err.code, err.field], ['kube_forbidden', 'kubeNamespace']);
    assert.match(err.message, new RegExp(`may not (?=.*update managedworkloads)(?=.*delete managedworkloads)(?=.*update secrets).* in namespace ${cluster.namespace}: bind rbac/role.yaml to it there$`));
  });
});
