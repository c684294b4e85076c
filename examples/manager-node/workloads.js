// How Manager's backend (Node.js) runs a container on Kubernetes: by writing a
// ManagedWorkload and reading its status. The operator does the rest (Deployment, Pods,
// rollouts). Uses @kubernetes/client-node, the client Manager's Kubernetes provider plans
// (#460). docs/manager.md explains each step; workloads.test.js runs every one against the
// local control plane.
//
// A Manager node of type `kubernetes` maps to one namespace; a container maps to one
// ManagedWorkload there. The provider id Manager stores in Containers.containerId is
// "namespace/name": permanent, never a Pod name, UID or IP.

import * as k8s from '@kubernetes/client-node';

export const GROUP = 'opensource-server.mieweb.org';
export const VERSION = 'v1alpha1';
export const PLURAL = 'managedworkloads';
export const NODE_ID_LABEL = 'opensource-server.mieweb.org/node-id';
export const CONTAINER_ID_LABEL = 'opensource-server.mieweb.org/container-id';

const MERGE_PATCH = k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch);

/** "namespace/name" → {namespace, name}. */
export function parseProviderId(providerId) {
  const parts = String(providerId).split('/');
  if (parts.length !== 2 || !parts[0] || !parts[1]) {
    throw new Error(`not a Kubernetes provider id (namespace/name): ${providerId}`);
  }
  return { namespace: parts[0], name: parts[1] };
}

/**
 * Manager's container status (utils/container-status.js) for a ManagedWorkload, or for
 * `null` when it does not exist. Only status written for the current spec counts: right
 * after a change, the old phase describes the old spec.
 */
export function managerStatus(mw) {
  if (!mw) return 'missing';
  const status = mw.status ?? {};
  if (status.observedGeneration !== mw.metadata?.generation) {
    // Not yet seen by the operator: a start, stop or change is on its way.
    return mw.spec?.state === 'Stopped' ? 'offline' : 'creating';
  }
  switch (status.phase) {
    case 'Running':
      return 'running';
    case 'Stopping':
    case 'Stopped':
      return 'offline';
    case 'Failed':
      return 'failed';
    case 'Creating':
    case 'Updating':
    default:
      return 'creating';
  }
}

/** One Kubernetes node of Manager: a kubeconfig (and context) and a namespace. */
export class KubernetesWorkloads {
  /**
   * @param {object} opts
   * @param {string} [opts.kubeconfigPath] Node.kubeconfigPath
   * @param {string} [opts.kubeconfig] the kubeconfig itself (YAML or JSON), when kept elsewhere;
   *   with neither: $KUBECONFIG, ~/.kube/config or the in-cluster service account
   * @param {string} [opts.context] Node.kubeContext
   * @param {string} opts.namespace Node.kubeNamespace
   */
  constructor({ kubeconfigPath, kubeconfig, context, namespace }) {
    this.kc = new k8s.KubeConfig();
    if (kubeconfigPath) this.kc.loadFromFile(kubeconfigPath);
    else if (kubeconfig) this.kc.loadFromString(kubeconfig);
    else this.kc.loadFromDefault();
    if (context) this.kc.setCurrentContext(context);
    this.namespace = namespace;
    this.api = this.kc.makeApiClient(k8s.CustomObjectsApi);
  }

  #ref(providerId) {
    const { namespace, name } = parseProviderId(providerId);
    return { group: GROUP, version: VERSION, plural: PLURAL, namespace, name };
  }

  /**
   * Create the workload for a Manager container (bin/create-container.js's job). Returns the
   * provider id to store in Containers.containerId. Idempotent: a retried job finds the
   * workload it made before.
   */
  async create({ name, image, command, args, env = {}, cpu, memory, nodeId, containerId, state = 'Running', ports, service }) {
    const resources = {};
    if (cpu || memory) {
      resources.requests = { ...(cpu && { cpu: String(cpu) }), ...(memory && { memory }) };
      resources.limits = { ...resources.requests };
    }
    const body = {
      apiVersion: `${GROUP}/${VERSION}`,
      kind: 'ManagedWorkload',
      metadata: {
        name,
        labels: { [NODE_ID_LABEL]: String(nodeId), [CONTAINER_ID_LABEL]: String(containerId) },
      },
      spec: {
        image,
        state,
        ...(command && { command }),
        ...(args && { args }),
        env: toEnv(env),
        ...(Object.keys(resources).length && { resources }),
        // Manager's Services rows' internal ports, e.g. [{containerPort: 80, name: 'http'}],
        // and a Service for a stable address ({type: 'ClusterIP'}; docs/networking.md).
        ...(ports?.length && { ports }),
        ...(service && { service }),
      },
    };
    const providerId = `${this.namespace}/${name}`;
    try {
      await this.api.createNamespacedCustomObject({
        group: GROUP,
        version: VERSION,
        plural: PLURAL,
        namespace: this.namespace,
        body,
      });
    } catch (err) {
      if (err.code !== 409) throw explain(err);
    }
    return providerId;
  }

  /** The workload, or null when it does not exist. Throws when the API is unreachable. */
  async get(providerId) {
    try {
      return await this.api.getNamespacedCustomObject(this.#ref(providerId));
    } catch (err) {
      if (err.code === 404) return null;
      throw explain(err);
    }
  }

  /** Manager's status: running, offline, creating, failed, missing, or unknown (API unreachable). */
  async status(providerId) {
    try {
      return managerStatus(await this.get(providerId));
    } catch {
      return 'unknown';
    }
  }

  async start(providerId) {
    return this.#patchSpec(providerId, { state: 'Running' });
  }

  async stop(providerId) {
    return this.#patchSpec(providerId, { state: 'Stopped' });
  }

  /**
   * Reconfigure (bin/reconfigure-container.js): env replaces the whole list, cpu/memory set
   * requests and limits. Any change rolls out a new Pod; wait for it with waitFor().
   */
  async reconfigure(providerId, { image, env, cpu, memory, command, args }) {
    const spec = {};
    if (image) spec.image = image;
    if (env) spec.env = toEnv(env);
    if (command) spec.command = command;
    if (args) spec.args = args;
    if (cpu || memory) {
      const values = { ...(cpu && { cpu: String(cpu) }), ...(memory && { memory }) };
      spec.resources = { requests: values, limits: values };
    }
    return this.#patchSpec(providerId, spec);
  }

  async #patchSpec(providerId, spec) {
    try {
      return await this.api.patchNamespacedCustomObject({ ...this.#ref(providerId), body: { spec } }, MERGE_PATCH);
    } catch (err) {
      throw explain(err);
    }
  }

  /**
   * Wait until the workload has reached the state its current spec asks for (Ready=True
   * for the current generation: running and available, or fully stopped), like
   * `kubectl wait --for=condition=Ready`. Rejects at once when it is Failed (Stalled=True),
   * with the operator's reason, and after `timeoutMs` (Manager's waitForTask default).
   * Resolves to {status, address, podIP, mw}: address is what to store in
   * Containers.ipv4Address (with a Service its stable address, which no rollout moves; without
   * one the serving Pod's IP), podIP the Pod's current address; both null when stopped.
   */
  async waitFor(providerId, { timeoutMs = 300_000, pollMs = 1_000 } = {}) {
    const deadline = Date.now() + timeoutMs;
    let last = null;
    for (;;) {
      last = await this.get(providerId);
      if (!last) throw new Error(`${providerId} does not exist`);
      const ready = currentCondition(last, 'Ready');
      const stalled = currentCondition(last, 'Stalled');
      if (stalled?.status === 'True') {
        throw new Error(`${providerId} failed: ${stalled.reason}: ${stalled.message}`);
      }
      if (ready?.status === 'True') {
        const stopped = last.spec?.state === 'Stopped';
        const address = stopped ? null : (last.status.address ?? null);
        return { status: managerStatus(last), address, podIP: last.status.podIP ?? null, mw: last };
      }
      if (Date.now() >= deadline) {
        throw new Error(`timed out waiting for ${providerId}: phase ${last.status?.phase ?? 'none yet'}`);
      }
      await new Promise((resolve) => setTimeout(resolve, pollMs));
    }
  }

  /**
   * Delete (DELETE …/containers/{id}): the operator's Deployment and Pods go by garbage
   * collection. Resolves once the workload is gone; a missing one counts as deleted.
   */
  async delete(providerId, { timeoutMs = 60_000, pollMs = 500 } = {}) {
    try {
      await this.api.deleteNamespacedCustomObject(this.#ref(providerId));
    } catch (err) {
      if (err.code !== 404) throw explain(err);
    }
    const deadline = Date.now() + timeoutMs;
    while ((await this.get(providerId)) !== null) {
      if (Date.now() >= deadline) throw new Error(`${providerId} is still there after ${timeoutMs} ms`);
      await new Promise((resolve) => setTimeout(resolve, pollMs));
    }
  }

  /**
   * NodeApi.clusterResources('lxc') for this node: the status source Manager's
   * decideStatus() reads, one entry per workload labelled with the node's id.
   */
  async clusterResources(nodeId) {
    const list = await this.api.listNamespacedCustomObject({
      group: GROUP,
      version: VERSION,
      plural: PLURAL,
      namespace: this.namespace,
      labelSelector: `${NODE_ID_LABEL}=${nodeId}`,
    });
    return list.items.map((mw) => ({
      vmid: `${mw.metadata.namespace}/${mw.metadata.name}`,
      name: mw.metadata.name,
      type: 'lxc',
      status: managerStatus(mw) === 'running' ? 'running' : 'stopped',
      node: String(nodeId),
    }));
  }
}

function toEnv(env) {
  return Object.entries(env).map(([name, value]) => ({ name, value: String(value) }));
}

function currentCondition(mw, type) {
  const generation = mw.metadata?.generation;
  if (mw.status?.observedGeneration !== generation) return undefined;
  return (mw.status.conditions ?? []).find((c) => c.type === type && c.observedGeneration === generation);
}

/** The API server's own message (it names the field or permission), not a dump of the response. */
function explain(err) {
  if (err instanceof k8s.ApiException) {
    let message = '';
    try {
      message = JSON.parse(err.body).message;
    } catch {
      message = typeof err.body === 'object' ? err.body?.message : String(err.body);
    }
    const wrapped = new Error(`Kubernetes API ${err.code}: ${message || 'no message'}`);
    wrapped.code = err.code;
    return wrapped;
  }
  return err;
}
