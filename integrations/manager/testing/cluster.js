// The local control plane as the provider's tests and hack/manager-e2e.sh's suite use it:
// a namespace of their own (its Pods on kwok, or with `realNode` on the real node: kubelet,
// containerd; hack/realnode.sh), storage whose claims bind to hostPath volumes, and Manager's
// identity, a ServiceAccount bound to rbac/role.yaml only, with a kubeconfig of its own.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const k8s = require('@kubernetes/client-node');

const m = require('../lib/mapping');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Poll `read` until `done(value)`; fail naming `what` and the last value. */
async function waitUntil(what, read, done, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    last = await read();
    if (done(last)) return last;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}; last: ${JSON.stringify(last)?.slice(0, 2000)}`);
    await sleep(250);
  }
}

/** `fn` on each of `items`, `width` at a time. */
async function inBatches(items, fn, width = 16) {
  for (let i = 0; i < items.length; i += width) await Promise.all(items.slice(i, i + width).map(fn));
}

class Cluster {
  /**
   * `storageClass`: the class's name when Manager's env must name it before it exists (two
   * clusters may share one: the first makes it). `realNode`: every Pod of the namespace goes
   * to the real node (its PodNodeSelector and PodTolerationRestriction annotations).
   * `namespace`: this name instead of one made from `prefix` (the pages benchmark's, which the
   * audit policy names).
   */
  constructor(kubeconfigPath, prefix, { storageClass, capacity = '5Gi', realNode = false, namespace } = {}) {
    this.kc = new k8s.KubeConfig();
    this.kc.loadFromFile(kubeconfigPath);
    this.core = this.kc.makeApiClient(k8s.CoreV1Api);
    this.custom = this.kc.makeApiClient(k8s.CustomObjectsApi);
    this.apps = this.kc.makeApiClient(k8s.AppsV1Api);
    this.rbac = this.kc.makeApiClient(k8s.RbacAuthorizationV1Api);
    this.storage = this.kc.makeApiClient(k8s.StorageV1Api);
    this.namespace = namespace || `${prefix}-${process.pid}-${Date.now() % 100000}`;
    this.class = storageClass || `${this.namespace}-sc`;
    this.capacity = capacity;
    this.realNode = realNode;
    this.volumes = [];
    this.ownsClass = false;
  }

  /** The namespace, a StorageClass with `volumes` hostPath volumes, Manager's Role. */
  async setUp(volumes) {
    const labels = { 'mw-operator.test/suite': 'true' };
    const key = 'mw-test/real-node';
    const annotations = this.realNode
      ? {
          'scheduler.alpha.kubernetes.io/node-selector': `${key}=true`,
          'scheduler.alpha.kubernetes.io/defaultTolerations': JSON.stringify([{ key, operator: 'Equal', value: 'true', effect: 'NoSchedule' }]),
        }
      : undefined;
    await this.core.createNamespace({ body: { metadata: { name: this.namespace, labels, annotations } } });
    await waitUntil('the default ServiceAccount', () => this.core.readNamespacedServiceAccount({ name: 'default', namespace: this.namespace }).catch(() => null), Boolean);
    await this.storage
      .createStorageClass({
        body: {
          metadata: { name: this.class, labels },
          provisioner: 'kubernetes.io/no-provisioner',
          volumeBindingMode: 'Immediate',
          allowVolumeExpansion: true,
          reclaimPolicy: 'Retain',
        },
      })
      .then(
        () => (this.ownsClass = true),
        (err) => {
          if (err.code !== 409) throw err;
        },
      );
    await this.addVolumes(volumes);
    const role = k8s.loadYaml(fs.readFileSync(path.join(__dirname, '..', 'rbac', 'role.yaml'), 'utf8'));
    await this.rbac.createNamespacedRole({ namespace: this.namespace, body: role });
    await this.core.createNamespacedServiceAccount({ namespace: this.namespace, body: { metadata: { name: 'manager' } } });
    await this.rbac.createNamespacedRoleBinding({
      namespace: this.namespace,
      body: {
        metadata: { name: 'manager' },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'manager' },
        subjects: [{ kind: 'ServiceAccount', name: 'manager', namespace: this.namespace }],
      },
    });
  }

  /** `count` more volumes of the class, a few created at a time. */
  async addVolumes(count) {
    const labels = { 'mw-operator.test/suite': 'true' };
    const names = Array.from({ length: count }, (_, i) => `${this.namespace}-pv${this.volumes.length + i}`);
    await inBatches(names, async (name) => {
      await this.core.createPersistentVolume({
        body: {
          metadata: { name, labels },
          spec: {
            capacity: { storage: this.capacity },
            accessModes: ['ReadWriteOnce'],
            persistentVolumeReclaimPolicy: 'Retain',
            storageClassName: this.class,
            hostPath: { path: `/tmp/mw-operator-test-volumes/${name}`, type: 'DirectoryOrCreate' },
          },
        },
      });
      this.volumes.push(name);
    });
  }

  /**
   * A kubeconfig for Manager's ServiceAccount: what an administrator gives Manager. With
   * `context`, its context has that name and the current context is a decoy that reaches no
   * API server, so only a node whose kubeContext names `context` can work with it.
   */
  async managerKubeconfig({ context } = {}) {
    const token = await this.core.createNamespacedServiceAccountToken({
      name: 'manager',
      namespace: this.namespace,
      body: { spec: { expirationSeconds: 3600 } },
    });
    const cluster = this.kc.getCurrentCluster();
    const ca = cluster.caFile ? fs.readFileSync(cluster.caFile).toString('base64') : cluster.caData;
    return [
      'apiVersion: v1',
      'kind: Config',
      'clusters:',
      `- name: local`,
      '  cluster:',
      `    server: ${cluster.server}`,
      `    certificate-authority-data: ${ca}`,
      ...(context ? ['- name: decoy', '  cluster:', '    server: https://127.0.0.1:9', `    certificate-authority-data: ${ca}`] : []),
      'users:',
      '- name: manager',
      '  user:',
      `    token: ${token.status.token}`,
      'contexts:',
      `- name: ${context || 'manager'}`,
      `  context: {cluster: local, user: manager, namespace: ${this.namespace}}`,
      ...(context ? ['- name: decoy', '  context: {cluster: decoy, user: manager, namespace: default}'] : []),
      `current-context: ${context ? 'decoy' : 'manager'}`,
      '',
    ].join('\n');
  }

  workload(name) {
    return this.custom
      .getNamespacedCustomObject({ group: m.GROUP, version: m.VERSION, plural: m.PLURAL, namespace: this.namespace, name })
      .catch((err) => {
        if (err.code === 404) return null;
        throw err;
      });
  }

  secret(name) {
    return this.core.readNamespacedSecret({ name, namespace: this.namespace }).catch((err) => {
      if (err.code === 404) return null;
      throw err;
    });
  }

  claim(name) {
    return this.core.readNamespacedPersistentVolumeClaim({ name, namespace: this.namespace }).catch((err) => {
      if (err.code === 404) return null;
      throw err;
    });
  }

  async pods(name) {
    const list = await this.core.listNamespacedPod({ namespace: this.namespace, labelSelector: `app.kubernetes.io/instance=${name}` });
    return list.items.filter((p) => !p.metadata.deletionTimestamp);
  }

  async tearDown() {
    if (process.env.MW_TEST_KEEP_NAMESPACES) return;
    await this.core.deleteNamespace({ name: this.namespace }).catch(() => {});
    await inBatches(this.volumes, (pv) => this.core.deletePersistentVolume({ name: pv }).catch(() => {}));
    if (this.ownsClass) await this.storage.deleteStorageClass({ name: this.class }).catch(() => {});
  }
}

module.exports = { Cluster, waitUntil, sleep, inBatches };
