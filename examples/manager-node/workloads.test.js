// Runs every example of docs/manager.md against the local control plane and the operator
// `make test` started (MW_TEST_KUBECONFIG: its admin kubeconfig). `node --test`.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import * as k8s from '@kubernetes/client-node';

import { KubernetesWorkloads, managerStatus, parseProviderId } from './workloads.js';

describe('pure parts', () => {
  test('provider ids are namespace/name', () => {
    assert.deepEqual(parseProviderId('apps/web-42'), { namespace: 'apps', name: 'web-42' });
    assert.throws(() => parseProviderId('101'), /namespace\/name/);
    assert.throws(() => parseProviderId('a/b/c'), /namespace\/name/);
  });

  test('phase → Manager status, current generation only', () => {
    const mw = (phase, observed = 2, state = 'Running') => ({
      metadata: { generation: 2 },
      spec: { state },
      status: { phase, observedGeneration: observed },
    });
    assert.equal(managerStatus(null), 'missing');
    assert.equal(managerStatus(mw('Running')), 'running');
    assert.equal(managerStatus(mw('Creating')), 'creating');
    assert.equal(managerStatus(mw('Updating')), 'creating');
    assert.equal(managerStatus(mw('Stopping')), 'offline');
    assert.equal(managerStatus(mw('Stopped')), 'offline');
    assert.equal(managerStatus(mw('Failed')), 'failed');
    assert.equal(managerStatus(mw('Running', 1)), 'creating', 'a change the operator has not seen yet');
    assert.equal(managerStatus(mw('Running', 1, 'Stopped')), 'offline', 'a stop on its way');
    assert.equal(managerStatus({ metadata: { generation: 1 }, spec: {} }), 'creating', 'no status yet');
  });
});

const kubeconfigPath = process.env.MW_TEST_KUBECONFIG;

describe('against the local control plane', { skip: !kubeconfigPath && 'MW_TEST_KUBECONFIG is not set (make test sets it)' }, () => {
  const namespace = `t-node-client-${process.pid}-${Date.now() % 100000}`;
  let core;
  let node;

  before(async () => {
    const kc = new k8s.KubeConfig();
    kc.loadFromFile(kubeconfigPath);
    core = kc.makeApiClient(k8s.CoreV1Api);
    await core.createNamespace({ body: { metadata: { name: namespace, labels: { 'mw-operator.test/suite': 'true' } } } });
    // Pods need the namespace's default ServiceAccount, which kube-controller-manager makes.
    for (let i = 0; i < 120; i++) {
      try {
        await core.readNamespacedServiceAccount({ name: 'default', namespace });
        break;
      } catch {
        await new Promise((r) => setTimeout(r, 500));
      }
    }
    node = new KubernetesWorkloads({ kubeconfigPath, namespace });
  });

  after(async () => {
    await core?.deleteNamespace({ name: namespace }).catch(() => {});
  });

  const podsOf = async (name) => {
    const list = await core.listNamespacedPod({ namespace, labelSelector: `app.kubernetes.io/instance=${name}` });
    return list.items.filter((p) => !p.metadata.deletionTimestamp);
  };

  test('create, wait, stop, start, reconfigure, list, delete', async () => {
    const id = await node.create({
      name: 'web-42',
      image: 'nginx:latest',
      env: { GREETING: 'hello' },
      cpu: '250m',
      memory: '256Mi',
      nodeId: 7,
      containerId: 42,
    });
    assert.equal(id, `${namespace}/web-42`);
    assert.equal(await node.create({ name: 'web-42', image: 'nginx:latest', nodeId: 7, containerId: 42 }), id, 'idempotent');

    let done = await node.waitFor(id);
    assert.equal(done.status, 'running');
    assert.match(done.podIP, /^\d+\.\d+\.\d+\.\d+$/);
    assert.equal(done.address, done.podIP, 'without a Service, the address is the Pod IP');
    assert.equal(done.mw.status.providerId, id);
    assert.equal(await node.status(id), 'running');

    await node.stop(id);
    done = await node.waitFor(id);
    assert.equal(done.status, 'offline');
    assert.equal(done.podIP, null, 'no IP while stopped');
    assert.equal((await podsOf('web-42')).length, 0);

    await node.start(id);
    done = await node.waitFor(id);
    assert.equal(done.status, 'running');

    await node.reconfigure(id, { env: { GREETING: 'bonjour' }, memory: '512Mi' });
    done = await node.waitFor(id);
    assert.equal(done.status, 'running');
    const pods = await podsOf('web-42');
    assert.equal(pods.length, 1, 'the old Pod is gone once Ready');
    const container = pods[0].spec.containers[0];
    assert.deepEqual(container.env.map(({ name, value }) => ({ name, value })), [{ name: 'GREETING', value: 'bonjour' }]);
    assert.equal(container.resources.limits.memory, '512Mi');
    assert.equal(done.podIP, pods[0].status.podIP, 'status.podIP is the current Pod IP');

    assert.deepEqual(await node.clusterResources(7), [
      { vmid: id, name: 'web-42', type: 'lxc', status: 'running', node: '7' },
    ]);
    assert.deepEqual(await node.clusterResources(8), [], 'only this node');

    await node.delete(id);
    assert.equal(await node.status(id), 'missing');
    await node.delete(id); // deleting a deleted container is not an error
  });

  test('with a Service, the address to store does not move when the Pod does', async () => {
    const id = await node.create({
      name: 'svc-7',
      image: 'nginx:latest',
      nodeId: 7,
      containerId: 45,
      ports: [{ containerPort: 80, name: 'http' }],
      service: { type: 'ClusterIP' },
    });
    let done = await node.waitFor(id);
    assert.equal(done.status, 'running');
    const service = await core.readNamespacedService({ name: 'svc-7', namespace });
    assert.equal(done.address, service.spec.clusterIP, "the Service's cluster IP");
    assert.notEqual(done.address, done.podIP);
    const firstPod = done.podIP;

    await node.reconfigure(id, { env: { GREETING: 'hallo' } });
    done = await node.waitFor(id);
    assert.equal(done.status, 'running');
    assert.notEqual(done.podIP, firstPod, 'a new Pod');
    assert.equal(done.address, service.spec.clusterIP, 'the same address');

    await node.stop(id);
    done = await node.waitFor(id);
    assert.equal(done.address, null, 'nothing to route to while stopped');
    await node.delete(id);
  });

  test('a container that cannot start rejects waitFor with the reason', async () => {
    // kwok holds Pods of this image in CrashLoopBackOff (hack/kwok/stages.yaml).
    const id = await node.create({ name: 'crashy', image: 'kwok.example/crash-loop-backoff', nodeId: 7, containerId: 43 });
    await assert.rejects(node.waitFor(id), /failed: CrashLoopBackOff/);
    assert.equal(await node.status(id), 'failed');
    await node.delete(id);
  });

  test('bad input is refused by the API server, naming the field', async () => {
    await assert.rejects(
      node.create({ name: 'bad', image: 'nginx:latest', cpu: 'lots', nodeId: 7, containerId: 44 }),
      (err) => err.code === 422 && /spec\.resources/.test(err.message),
    );
    assert.equal(await node.status(`${namespace}/bad`), 'missing');
  });

  test('an unreachable API is "unknown", not "missing"', async () => {
    const kc = new k8s.KubeConfig();
    kc.loadFromFile(kubeconfigPath);
    const config = JSON.parse(kc.exportConfig());
    // A port nothing listens on (binding port 1 needs root).
    config.clusters[0].cluster.server = 'https://127.0.0.1:1';
    const offline = new KubernetesWorkloads({ kubeconfig: JSON.stringify(config), namespace });
    assert.equal(await offline.status(`${namespace}/web-42`), 'unknown');
  });
});
