'use strict';
// Manager's provider for nodes of type `kubernetes`: what `node.api()` returns for them. It has
// the surface Manager's callers use on a ProxmoxApi (bin/create-container.js,
// bin/reconfigure-container.js, routers/api/v1/containers.js, utils/container-status.js) and
// does each call on a ManagedWorkload, which mw-operator runs as a one-replica Deployment.
//
// Every method takes Manager's (nodeName, providerId) arguments; the provider id is
// "namespace/name", permanent for the container's life. A write returns a task id naming the
// workload and the generation it made, and `waitForTask` waits until the operator reports
// Ready for that generation, so a job process that only holds the id can wait for it.

const net = require('net');
const k8s = require('@kubernetes/client-node');
const m = require('./mapping');
const { KubeconfigError, loadKubeConfig, redact } = require('./kubeconfig');
const { WorkloadCache } = require('./workload-cache');

const MERGE_PATCH = k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch);
const DELETE_TIMEOUT_MS = 60_000;
/** Manager's Containers.ipv4Address is a STRING(45). */
const MAX_ADDRESS_LENGTH = 45;

/** A call Kubernetes answered with an error, in the API server's own words. */
class KubernetesError extends Error {
  constructor(message, { code, reason } = {}) {
    // Job output reaches the container's owner: nothing that looks like a credential.
    super(redact(message));
    this.name = 'KubernetesError';
    this.code = code;
    // The workload's reason (ImagePullBackOff, Unschedulable, ClaimRejected, ...) when the
    // error is about what the workload does.
    this.reason = reason;
  }
}

/**
 * `err` as a KubernetesError: its message only (never its headers, body or cause), with the
 * node's `secrets` and anything like a credential taken out.
 */
function explain(err, what, secrets = []) {
  if (err instanceof m.MappingError || err instanceof KubernetesError || err instanceof KubeconfigError) return err;
  if (err instanceof k8s.ApiException) {
    let message;
    try {
      message = JSON.parse(err.body).message;
    } catch {
      message = typeof err.body === 'object' ? err.body?.message : String(err.body || '');
    }
    // client-node drops a 401's body; the API server's message there is "Unauthorized".
    message ||= err.code === 401 ? 'Unauthorized' : 'no message';
    return new KubernetesError(redact(`${what}: Kubernetes API ${err.code}: ${message}`, secrets), { code: err.code });
  }
  // V8 quotes the text it could not parse: an exec plugin's output holds its token.
  if (err instanceof SyntaxError) return new KubernetesError(`${what}: an answer was not valid JSON`);
  return new KubernetesError(redact(`${what}: ${err?.message ?? err}`, secrets));
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const { conditionAt } = m;

/**
 * The address Manager stores for a workload: `status.address`, unless it is longer than
 * Manager's column (a load balancer's host name, e.g. an AWS ELB's). Then an IP the load
 * balancer also serves on, else none: `why` says so, for the job's output.
 * @returns {{address: string|null, why?: string}}
 */
function managerAddress(mw) {
  const address = mw.status?.address ?? null;
  if (address === null || address.length <= MAX_ADDRESS_LENGTH) return { address };
  const ip = (mw.status.service?.loadBalancerIngress || []).find((a) => net.isIP(a) && a.length <= MAX_ADDRESS_LENGTH);
  if (ip) return { address: ip };
  return {
    address: null,
    why:
      `the load balancer's address ${address} (${address.length} characters) does not fit Manager's ipv4Address ` +
      `(at most ${MAX_ADDRESS_LENGTH}); use a load balancer that gives an IP, or MW_SERVICE_TYPE=ClusterIP`,
  };
}

/** Cores and memory (MB) as the spec's limits hold them. */
function limitsOf(spec) {
  const limits = spec.resources?.limits || {};
  const cores = Number(limits.cpu);
  const mem = /^(\d+)Mi$/.exec(limits.memory || '');
  return {
    cores: Number.isInteger(cores) && cores > 0 ? cores : m.DEFAULT_CPUS,
    memory: mem ? Number(mem[1]) : m.DEFAULT_MEMORY_MB,
  };
}

/** Proxmox's `rootfs` forms: "storage:GB", "storage:vol,size=NG", a number of GB. */
function rootfsGb(value) {
  if (typeof value === 'number') return value;
  const s = String(value);
  const size = /size=(\d+)G?/i.exec(s);
  if (size) return Number(size[1]);
  const last = /(?:^|:)(\d+)$/.exec(s);
  if (last) return Number(last[1]);
  throw new m.MappingError(`rootfs ${JSON.stringify(value)} names no size in GB`);
}

class KubernetesApi {
  /**
   * What this provider does unlike Manager's Proxmox one: Manager's shared code asks these (the
   * patch's Node#capabilities()) rather than comparing node types.
   */
  static capabilities = Object.freeze({
    // createLxc takes the image reference and the whole container (env, resources, disk, GPU,
    // ports) at once and names it (providerId): no registry lookup, no VMID, no MAC address.
    createsFromImage: true,
    // updateLxcConfig applies env, entrypoint, resources and ports in one write, a rollout that
    // waitForTask follows: no stop and start around it.
    rollsOut: true,
    // A container's ports are its Services rows: adding or deleting one after create needs a
    // reconfigure job (updateLxcConfig with `services`).
    servicesNeedReconfigure: true,
    // The cluster assigns the GPU (its device plugin sets NVIDIA_VISIBLE_DEVICES): Manager's
    // `all` would show the container every GPU of the host.
    assignsGpu: true,
  });

  /** The kubeconfig's credentials, taken out of every error. */
  #secrets;

  /**
   * @param {object} node the Node row: id, name, kubeconfigPath, kubeContext, kubeNamespace
   * @param {object} [opts]
   * @param {string} [opts.kubeconfig] a kubeconfig's text, instead of node.kubeconfigPath
   * @param {object} [opts.env] Manager's environment: the MW_* settings (default process.env)
   * @param {object} [opts.settings] how containers map (default: settingsFromEnv(env))
   * @param {function} [opts.log] progress lines (default console.log: a job's output)
   */
  constructor(node, opts = {}) {
    if (!node || node.id == null) throw new m.MappingError('a kubernetes node needs its id');
    this.node = node;
    const env = opts.env || process.env;
    // The node's kubeconfig only (lib/kubeconfig.js): never $KUBECONFIG or ~/.kube/config.
    const { kc, secrets } = loadKubeConfig(node, { text: opts.kubeconfig, env });
    this.kc = kc;
    this.#secrets = secrets;
    this.namespace = node.kubeNamespace || this.kc.getContextObject(this.kc.getCurrentContext())?.namespace || 'default';
    this.settings = opts.settings || m.settingsFromEnv(env);
    this.log = opts.log || ((line) => console.log(line));
    this.custom = this.kc.makeApiClient(k8s.CustomObjectsApi);
    this.core = this.kc.makeApiClient(k8s.CoreV1Api);
  }

  #explain(err, what) {
    return explain(err, what, this.#secrets);
  }

  /** The provider id of a container of this node. */
  providerId(hostname) {
    return `${this.namespace}/${hostname}`;
  }

  #ref(providerId) {
    const { namespace, name } = m.parseProviderId(providerId);
    if (namespace !== this.namespace) {
      throw new m.MappingError(`${providerId} is not in this node's namespace (${this.namespace})`);
    }
    return { group: m.GROUP, version: m.VERSION, plural: m.PLURAL, namespace, name };
  }

  async #get(providerId) {
    try {
      return await this.custom.getNamespacedCustomObject(this.#ref(providerId));
    } catch (err) {
      if (err.code === 404) return null;
      throw this.#explain(err, `reading ${providerId}`);
    }
  }

  /** The workload, which must be this provider's: the bridge's are never touched. */
  async #ours(providerId) {
    const mw = await this.#get(providerId);
    if (!mw) throw new KubernetesError(`${providerId} does not exist`, { code: 404 });
    this.#mustBeOurs(mw, providerId);
    return mw;
  }

  #mustBeOurs(obj, what) {
    const l = obj.metadata?.labels || {};
    if (l[m.SYNCED_BY_LABEL]) {
      throw new KubernetesError(
        `${what} is served by the bridge (label ${m.SYNCED_BY_LABEL}=${l[m.SYNCED_BY_LABEL]}); ` +
          'a node is served by the bridge or by Manager\'s jobs, not both (docs/manager.md)',
        { code: 409 },
      );
    }
    if (l[m.PROVIDER_LABEL] !== m.PROVIDER_VALUE || l[m.NODE_ID_LABEL] !== String(this.node.id)) {
      throw new KubernetesError(`${what} was not made by Manager for node ${this.node.id}; it is left alone`, { code: 409 });
    }
  }

  async #secret(name) {
    try {
      return await this.core.readNamespacedSecret({ name, namespace: this.namespace });
    } catch (err) {
      if (err.code === 404) return null;
      throw this.#explain(err, `reading Secret ${this.namespace}/${name}`);
    }
  }

  /**
   * Create or replace the env Secret (only ever ours), owned by the workload once it exists.
   * @returns the Secret it replaced, null when it made a new one
   */
  async #writeSecret(secret, owner) {
    const body = structuredClone(secret);
    if (owner) {
      body.metadata.ownerReferences = [
        { apiVersion: owner.apiVersion, kind: owner.kind, name: owner.metadata.name, uid: owner.metadata.uid },
      ];
    }
    const { name } = body.metadata;
    const existing = await this.#secret(name);
    try {
      if (!existing) {
        await this.core.createNamespacedSecret({ namespace: this.namespace, body });
        return null;
      }
      this.#mustBeOurs(existing, `Secret ${this.namespace}/${name}`);
      body.metadata.resourceVersion = existing.metadata.resourceVersion;
      if (!owner && existing.metadata.ownerReferences) body.metadata.ownerReferences = existing.metadata.ownerReferences;
      await this.core.replaceNamespacedSecret({ name, namespace: this.namespace, body });
      return existing;
    } catch (err) {
      throw this.#explain(err, `writing Secret ${this.namespace}/${name}`);
    }
  }

  /** The env the workload's Secret holds. */
  async #env(mw) {
    const secret = await this.#secret(`${mw.metadata.name}${m.SECRET_SUFFIX}`);
    const env = {};
    for (const [k, v] of Object.entries(secret?.data || {})) env[k] = Buffer.from(v, 'base64').toString();
    return env;
  }

  // --- Manager's NodeApi surface -----------------------------------------------------------

  /** Kubernetes has no VMIDs: the provider id is namespace/name (from createLxc). */
  async nextId() {
    throw new m.MappingError('a kubernetes node allocates no VMID; the provider id is namespace/name');
  }

  /** No Proxmox storages: the rootfs is a PersistentVolumeClaim of the cluster's class. */
  async datastores() {
    return [];
  }

  /**
   * Create the container's workload and env Secret, running (`start: false` makes it stopped).
   * Idempotent: a retried job finds the workload it made for the same container.
   * @param {string} nodeName
   * @param {object} o hostname, image (or template), entrypoint, env (Manager's NUL-joined env),
   *   cores, memory (MB), rootfs (GB or "storage:GB"), nvidia, services ([{type, internalPort,
   *   protocol}]), containerId (Containers.id), tags (the owner), start
   * @returns {Promise<string>} a task id; the provider id is `providerId(hostname)`
   */
  async createLxc(nodeName, o = {}) {
    const { workload, secret } = m.desired(
      {
        namespace: this.namespace,
        nodeId: this.node.id,
        containerId: o.containerId,
        hostname: o.hostname,
        username: o.tags || o.username,
        image: o.image || o.template,
        entrypoint: o.entrypoint,
        env: o.env,
        cores: o.cores,
        memory: o.memory,
        rootfs: o.rootfs == null ? undefined : rootfsGb(o.rootfs),
        nvidia: o.nvidia,
        services: o.services,
      },
      this.settings,
    );
    if (o.containerId == null) throw new m.MappingError('createLxc needs containerId (Containers.id)');
    // Running is the default: a spec without `state` is what the bridge makes too, so a node
    // moved between them keeps its workloads' generation.
    if (o.start === false) workload.spec.state = 'Stopped';
    const providerId = this.providerId(o.hostname);
    let existing = await this.#get(providerId);
    if (existing) {
      this.#mustBeOurs(existing, providerId);
      if (existing.metadata.labels[m.CONTAINER_ID_LABEL] !== String(o.containerId)) {
        throw new KubernetesError(
          `${providerId} belongs to container ${existing.metadata.labels[m.CONTAINER_ID_LABEL]}, not ${o.containerId}`,
          { code: 409 },
        );
      }
    }
    // The Secret first, so the Pod never starts without its env; a replace that fails (after
    // its retries on 409) gives the Secret its old data back (as updateLxcConfig).
    const previous = await this.#writeSecret(secret, existing);
    let made;
    if (existing) {
      try {
        made = await this.#replaceRetrying(providerId, existing, (current) => ({
          ...workload,
          metadata: { ...current.metadata, ...workload.metadata, resourceVersion: current.metadata.resourceVersion },
        }));
      } catch (err) {
        await this.#restoreSecret(secret, previous, existing, err);
        throw err;
      }
    } else {
      try {
        made = await this.custom.createNamespacedCustomObject({
          group: m.GROUP,
          version: m.VERSION,
          plural: m.PLURAL,
          namespace: this.namespace,
          body: workload,
        });
      } catch (err) {
        throw this.#explain(err, `creating ${providerId}`);
      }
      // Now the Secret goes with the workload when it is deleted.
      await this.#writeSecret(secret, made);
    }
    this.log(`Kubernetes: ${existing ? 'updated' : 'created'} ManagedWorkload ${providerId} (generation ${made.metadata.generation})`);
    return m.taskId('create', this.namespace, o.hostname, made.metadata.generation);
  }

  /**
   * Manager's config update (Proxmox semantics): `env` is the whole effective env,
   * NUL-joined; `entrypoint` one string; `delete` lists what to unset (env, entrypoint);
   * `cores`, `memory` (MB) and `rootfs` ("storage:GB", grow only) resize. `tags` is the owner.
   * `swap` is not applied (Kubernetes has no per-container swap limit): the job's output says
   * so, and it changes nothing. `services` ([{type, internalPort, protocol}], Manager's Services
   * rows as they are now) sets the ports and Service as createLxc does. `hookscript`,
   * `features` and the like are ignored.
   * @returns {Promise<string>} a task id for the resulting generation
   */
  async updateLxcConfig(nodeName, providerId, config = {}) {
    const mw = await this.#ours(providerId);
    const name = mw.metadata.name;
    if (Number(config.swap) > 0) {
      this.log(`Kubernetes: swap ${config.swap} MB is not applied to ${providerId}: Kubernetes has no per-container swap limit`);
    }
    const deleted = new Set(String(config.delete || '').split(',').map((s) => s.trim()).filter(Boolean));
    const touchesEnv = config.env !== undefined || deleted.has('env');
    const env = touchesEnv ? (deleted.has('env') ? {} : m.parseEnv(config.env)) : null;
    const secret = touchesEnv
      ? m.secret({ namespace: this.namespace, nodeId: this.node.id, containerId: mw.metadata.labels[m.CONTAINER_ID_LABEL], hostname: name }, env)
      : null;
    // Everything is checked (this.#apply throws a MappingError) before anything is written.
    this.#apply(mw, config, deleted, env, secret);
    // The order: the Secret, then the workload's replace, retried on 409 (the operator's status
    // write moved the resourceVersion) by re-reading it and applying the change again; if the
    // replace still fails, the Secret gets its old data back. The Secret must come first: the
    // new pod template (its env-sha256 annotation, its secretKeyRefs) must never start a Pod
    // before the Secret holds that env (a new key would not exist, the digest would lie). So
    // after this call the Secret's data and the spec's digest agree, whether it succeeded or
    // failed; only a Pod restarted in the moment between the two writes sees the new env early.
    const previous = secret ? await this.#writeSecret(secret, mw) : undefined;
    let updated;
    try {
      updated = await this.#replaceRetrying(providerId, mw, (current) => this.#apply(current, config, deleted, env, secret));
    } catch (err) {
      if (secret) await this.#restoreSecret(secret, previous, mw, err);
      throw err;
    }
    const changed = updated.metadata.generation !== mw.metadata.generation;
    this.log(`Kubernetes: ${providerId} ${changed ? `changed (generation ${updated.metadata.generation})` : 'unchanged'}`);
    return m.taskId('update', this.namespace, name, updated.metadata.generation);
  }

  /** The workload `mw` with Manager's config applied: what updateLxcConfig replaces it with. */
  #apply(mw, config, deleted, env, secret) {
    const name = mw.metadata.name;
    const providerId = `${mw.metadata.namespace}/${name}`;
    let spec = { ...mw.spec };
    if (config.rootfs !== undefined) {
      // A claim never shrinks (the operator keeps it as it is): Manager is told so rather than
      // shown a smaller disk than the container has, as Proxmox refuses a smaller rootfs too.
      const current = (spec.volumes || []).find((v) => v.name === m.ROOTFS_VOLUME);
      const currentGb = current ? Number((/^(\d+)Gi$/.exec(current.size) || [])[1]) : NaN;
      const gb = rootfsGb(config.rootfs);
      if (gb < currentGb) {
        throw new m.MappingError(`rootfs ${gb} GB refused: a disk never shrinks, and ${name}-${m.ROOTFS_VOLUME} is ${currentGb} GB`);
      }
    }
    if (env) spec = m.envFields(spec, env, secret.metadata.name);
    if (deleted.has('entrypoint')) delete spec.command;
    else if (config.entrypoint !== undefined) {
      const words = String(config.entrypoint).trim() ? m.shellSplit(String(config.entrypoint).trim()) : [];
      if (words.length) spec.command = words;
      else delete spec.command;
    }
    if (config.cores !== undefined || config.memory !== undefined) {
      const now = limitsOf(spec);
      const cores = config.cores !== undefined ? Number(config.cores) : now.cores;
      const memory = config.memory !== undefined ? Number(config.memory) : now.memory;
      if (!Number.isInteger(cores) || cores < 1) throw new m.MappingError(`cores (${config.cores}) is not a positive whole number`);
      if (!Number.isInteger(memory) || memory < 1) throw new m.MappingError(`memory (${config.memory}) is not a positive whole number`);
      spec.resources = m.resources(cores, memory, !!spec.resources?.gpus, this.settings.requestsPercent);
    }
    if (config.rootfs !== undefined) {
      const gb = rootfsGb(config.rootfs);
      const volumes = (spec.volumes || []).map((v) => (v.name === m.ROOTFS_VOLUME ? { ...v, size: `${gb}Gi` } : v));
      if (!volumes.some((v) => v.name === m.ROOTFS_VOLUME)) {
        throw new m.MappingError(`${providerId} has no rootfs volume to resize (MW_ROOTFS_MOUNT_PATH is none)`);
      }
      spec.volumes = volumes;
    }
    // Manager's Services rows as they are now (a PUT added or deleted some): the ports and the
    // Service, as the create made them; in the same write, so one rollout.
    if (config.services !== undefined) spec = m.portFields(spec, config.services, this.settings);
    // The administrator's isolation setting as it is now (MW_ISOLATION_ALLOW_FROM), so that a
    // change of it reaches each container at its next reconfigure. No rollout: the operator
    // keeps the NetworkPolicy beside the Pod, not in it.
    spec = m.isolationFields(spec, this.settings);
    const metadata = { ...mw.metadata };
    if (config.tags !== undefined) metadata.annotations = { ...(metadata.annotations || {}), [m.OWNER_ANNOTATION]: String(config.tags) };
    return { ...mw, metadata, spec, status: undefined };
  }

  /**
   * Replace the workload with `build(current)`; on 409 Conflict (its resourceVersion moved:
   * the operator writes status) read it again and build again, a few times.
   */
  async #replaceRetrying(providerId, mw, build, attempts = 5) {
    let current = mw;
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.custom.replaceNamespacedCustomObject({ ...this.#ref(providerId), body: build(current) });
      } catch (err) {
        if (err.code !== 409 || attempt >= attempts) throw this.#explain(err, `updating ${providerId}`);
        current = await this.#ours(providerId);
      }
    }
  }

  /** After a failed replace: the Secret back to what the workload's spec still refers to. */
  async #restoreSecret(secret, previous, owner, cause) {
    const body = structuredClone(secret);
    body.data = previous?.data || {};
    try {
      await this.#writeSecret(body, owner);
    } catch (err) {
      throw new KubernetesError(
        `${cause.message}; and restoring Secret ${this.namespace}/${secret.metadata.name} failed too (${err.message}): ` +
          'its env is newer than the workload\'s, a retry of the job writes both again',
        { code: cause.code },
      );
    }
  }

  /**
   * The workload's configuration in the shapes Manager parses: `hostname` (the delete check),
   * `cores`, `memory` (MB), `rootfs` ("claim,size=NG", parseRootfsSizeGb), `env` (NUL-joined,
   * parseLxcEnvString), `entrypoint` and `ports` (names, comma-separated).
   */
  async lxcConfig(nodeName, providerId) {
    const mw = await this.#get(providerId);
    if (!mw) throw new KubernetesError(`${providerId} does not exist`, { code: 404 });
    const { cores, memory } = limitsOf(mw.spec);
    const rootfs = (mw.spec.volumes || []).find((v) => v.name === m.ROOTFS_VOLUME);
    const size = rootfs ? /^(\d+)Gi$/.exec(rootfs.size) : null;
    const env = await this.#env(mw);
    return {
      hostname: mw.spec.hostname || mw.metadata.name,
      image: mw.spec.image,
      cores,
      memory,
      swap: 0,
      ...(size ? { rootfs: `${mw.metadata.name}-${m.ROOTFS_VOLUME},size=${size[1]}G` } : {}),
      ...(Object.keys(env).length ? { env: m.joinEnv(env) } : {}),
      ...(mw.spec.command?.length ? { entrypoint: m.shellJoin(mw.spec.command) } : {}),
      // The ports' names (http-80,tcp-22): a services change is a change, not a restart.
      ...(mw.spec.ports?.length ? { ports: mw.spec.ports.map((p) => p.name).join(',') } : {}),
      tags: mw.metadata.annotations?.[m.OWNER_ANNOTATION],
      nvidia: !!mw.spec.resources?.gpus,
    };
  }

  async #setState(providerId, state, op) {
    await this.#ours(providerId);
    let mw;
    try {
      mw = await this.custom.patchNamespacedCustomObject({ ...this.#ref(providerId), body: { spec: { state } } }, MERGE_PATCH);
    } catch (err) {
      throw this.#explain(err, `${op} ${providerId}`);
    }
    this.log(`Kubernetes: ${providerId} ${state} (generation ${mw.metadata.generation})`);
    return m.taskId(op, mw.metadata.namespace, mw.metadata.name, mw.metadata.generation);
  }

  startLxc(nodeName, providerId) {
    return this.#setState(providerId, 'Running', 'start');
  }

  stopLxc(nodeName, providerId) {
    return this.#setState(providerId, 'Stopped', 'stop');
  }

  /** `{status}` as Proxmox words it: `running` while the workload runs or is on its way. */
  async getLxcStatus(nodeName, providerId) {
    const mw = await this.#get(providerId);
    if (!mw) throw new KubernetesError(`${providerId} does not exist`, { code: 404 });
    const word = m.managerStatus(mw);
    return {
      status: mw.spec.state === 'Stopped' ? 'stopped' : 'running',
      managerStatus: word,
      phase: mw.status?.phase ?? null,
      vmid: providerId,
    };
  }

  /**
   * Wait for a task: until the operator reports Ready for the task's generation (running and
   * available, or fully stopped), or for a delete until the workload is gone. Fails at once
   * with the workload's reason when it is Failed (ImagePullBackOff, ClaimRejected, ...), and at
   * the time limit with what it still waits on (Unschedulable and the scheduler's words,
   * ClaimPending, ...), never a bare timeout.
   */
  async waitForTask(nodeName, id, pollInterval = 2000, timeout = 300000) {
    const t = m.parseTaskId(id);
    const providerId = `${t.namespace}/${t.name}`;
    const deadline = Date.now() + timeout;
    let said = '';
    for (;;) {
      const mw = await this.#get(providerId);
      if (t.op === 'delete') {
        if (!mw) return { status: 'stopped', exitstatus: 'OK' };
      } else {
        if (!mw) throw new KubernetesError(`${providerId} was deleted while waiting for it`, { code: 404 });
        // A later write supersedes this task; its result is what there is to wait for.
        const generation = Math.max(t.generation, mw.metadata.generation);
        const stalled = conditionAt(mw, 'Stalled', generation);
        if (stalled?.status === 'True') {
          throw new KubernetesError(`${providerId} failed: ${stalled.reason}: ${stalled.message}`, { reason: stalled.reason });
        }
        const ready = conditionAt(mw, 'Ready', generation);
        if (ready?.status === 'True') {
          this.log(`Kubernetes: ${providerId} ${mw.status.phase}`);
          return { status: 'stopped', exitstatus: 'OK', phase: mw.status.phase };
        }
        const progress = this.#progress(mw, generation);
        if (progress !== said) {
          this.log(`Kubernetes: ${providerId} ${progress}`);
          said = progress;
        }
      }
      if (Date.now() >= deadline) {
        const what = mw ? this.#progress(mw, Math.max(t.generation, mw.metadata.generation)) : 'gone';
        const reason = mw ? conditionAt(mw, 'Reconciling', t.generation)?.reason : undefined;
        throw new KubernetesError(`${providerId} not ${t.op === 'delete' ? 'deleted' : 'ready'} after ${timeout} ms: ${what}`, { reason });
      }
      await sleep(pollInterval);
    }
  }

  #progress(mw, generation) {
    if ((mw.status?.observedGeneration ?? -1) < generation) {
      return `waiting for mw-operator to act on generation ${generation} (is it running and watching ${mw.metadata.namespace}?)`;
    }
    const reconciling = conditionAt(mw, 'Reconciling', generation);
    const why = reconciling?.status === 'True' ? `: ${reconciling.reason}: ${reconciling.message}` : '';
    return `${mw.status.phase}${why}`;
  }

  /** No MAC: a Pod has none worth routing to. Manager stores NULL. */
  async getLxcMacAddress() {
    return null;
  }

  /**
   * `status.address`: the Service's stable address, else the serving Pod's IP; null when none,
   * or when it does not fit Manager's column (said in the job's output; see managerAddress).
   */
  async getLxcIpAddress(nodeName, providerId) {
    const mw = await this.#get(providerId);
    if (!mw || mw.spec.state === 'Stopped') return null;
    const { address, why } = managerAddress(mw);
    if (why) this.log(`Kubernetes: ${providerId} has no address for Manager: ${why}`);
    return address;
  }

  async getLxcNetworkInfo(nodeName, providerId) {
    return { macAddress: null, ipv4Address: await this.getLxcIpAddress(nodeName, providerId) };
  }

  /**
   * Delete the workload; its Deployment, Pods, Service and env Secret go by garbage collection,
   * its rootfs claim as MW_ROOTFS_ON_DELETE says (retain: kept for a workload of the same name).
   * Resolves once it is gone; a missing one counts as deleted.
   * `force` and `purge` do not change that: Manager's delete passes both, always, and Proxmox's
   * purge drops backup, replication and HA entries, not the disk (Proxmox deletes that anyway).
   * Read as "delete the data", purge would make MW_ROOTFS_ON_DELETE=retain mean nothing.
   */
  async deleteContainer(nodeName, providerId) {
    const mw = await this.#get(providerId);
    if (mw) {
      this.#mustBeOurs(mw, providerId);
      try {
        await this.custom.deleteNamespacedCustomObject({ ...this.#ref(providerId), propagationPolicy: 'Background' });
      } catch (err) {
        if (err.code !== 404) throw this.#explain(err, `deleting ${providerId}`);
      }
    }
    const { name } = m.parseProviderId(providerId);
    await this.waitForTask(nodeName, m.taskId('delete', this.namespace, name, 0), 500, DELETE_TIMEOUT_MS);
    return { data: null };
  }

  /**
   * This node's workloads, as Manager's status resolver reads a Proxmox cluster snapshot:
   * `vmid` the provider id; `status` running/stopped; `managerStatus` the word Manager shows
   * (creating, running, offline, failed) and `reason` why, from the operator's conditions.
   * Manager asks on every read of its containers: the answer comes from the node's table, one
   * list kept current by a watch (lib/workload-cache.js), not from a list each time.
   */
  async clusterResources(type = null) {
    if (type && type !== 'lxc') return [];
    const labelSelector = `${m.NODE_ID_LABEL}=${this.node.id},${m.PROVIDER_LABEL}=${m.PROVIDER_VALUE}`;
    const key = WorkloadCache.key(this.node.id, this.namespace, labelSelector, this.kc);
    const items = await WorkloadCache.read(key, () => ({
      kc: this.kc,
      namespace: this.namespace,
      labelSelector,
      list: () => this.#listWorkloads(labelSelector),
    }));
    return items.map((item) => ({ ...item, node: this.node.name }));
  }

  async #listWorkloads(labelSelector) {
    try {
      return await this.custom.listNamespacedCustomObject({
        group: m.GROUP,
        version: m.VERSION,
        plural: m.PLURAL,
        namespace: this.namespace,
        labelSelector,
      });
    } catch (err) {
      throw this.#explain(err, `listing ${this.namespace}'s workloads`);
    }
  }
}

module.exports = { KubernetesApi, KubernetesError, explain, rootfsGb, managerAddress };
