'use strict';
// What one Manager container becomes in the cluster: a pure function of what Manager's create
// job knows (hostname, image, entrypoint, effective env, approved resources, Services rows).
// These are the rules of the bridge's src/bridge/mapping.rs, in JavaScript: the two must make
// the same ManagedWorkload from the same container, so a node can move between the bridge and
// this provider without a rollout. ../mapping-cases.json is the shared table both languages'
// tests check (cargo test: bridge::mapping; node --test: test/mapping.test.js).

const crypto = require('crypto');
const net = require('net');

const GROUP = 'opensource-server.mieweb.org';
const VERSION = 'v1alpha1';
const PLURAL = 'managedworkloads';
const KIND = 'ManagedWorkload';
const NODE_ID_LABEL = `${GROUP}/node-id`;
const CONTAINER_ID_LABEL = `${GROUP}/container-id`;
/** The bridge's ownership label (mapping.rs SYNCED_BY_LABEL). This provider never sets it. */
const SYNCED_BY_LABEL = `${GROUP}/synced-by`;
/** Marks what Manager's own jobs made through this provider; the bridge refuses such objects. */
const PROVIDER_LABEL = `${GROUP}/provider`;
const PROVIDER_VALUE = 'manager';
const OWNER_ANNOTATION = `${GROUP}/owner`;
/** SHA-256 of the env Secret's data on the pod template: a changed value rolls out a new Pod. */
const ENV_DIGEST_ANNOTATION = `${GROUP}/env-sha256`;
const SECRET_SUFFIX = '-manager-env';
const ROOTFS_VOLUME = 'rootfs';
const MAX_PORTS = 64;

/** Manager's defaults when no resource request was approved (bin/create-container.js). */
const DEFAULT_CPUS = 4;
const DEFAULT_MEMORY_MB = 4096;
const DEFAULT_ROOTFS_GB = 50;

/** A container Manager cannot run on Kubernetes as given; the message names the field. */
class MappingError extends Error {
  constructor(message) {
    super(message);
    this.name = 'MappingError';
  }
}

/**
 * How containers become workloads on this node: the bridge's flags, read from the same
 * environment variables (Manager's systemd units read an EnvironmentFile).
 */
function settingsFromEnv(env = process.env) {
  const percent = env.MW_REQUESTS_PERCENT === undefined ? 100 : Number(env.MW_REQUESTS_PERCENT);
  if (!Number.isInteger(percent) || percent < 1 || percent > 100) {
    throw new MappingError(`MW_REQUESTS_PERCENT must be a whole number from 1 to 100, not ${env.MW_REQUESTS_PERCENT}`);
  }
  const mountPath = env.MW_ROOTFS_MOUNT_PATH === undefined ? '/data' : env.MW_ROOTFS_MOUNT_PATH;
  const onDelete = (env.MW_ROOTFS_ON_DELETE || 'retain').toLowerCase();
  if (!['retain', 'delete'].includes(onDelete)) {
    throw new MappingError(`MW_ROOTFS_ON_DELETE must be retain or delete, not ${env.MW_ROOTFS_ON_DELETE}`);
  }
  const serviceType = env.MW_SERVICE_TYPE === undefined ? 'ClusterIP' : env.MW_SERVICE_TYPE;
  // Manager's agent dials ipv4Address:internalPort; a node port is another number
  // (docs/networking.md, "Which topology needs what").
  if (serviceType === 'NodePort') {
    throw new MappingError(
      'MW_SERVICE_TYPE=NodePort does not fit Manager: its agent dials ipv4Address:internalPort, while a node port is a ' +
        'different number (30000-32767). Use ClusterIP (the default) when the agent runs inside the cluster or on one of ' +
        'its nodes, LoadBalancer (e.g. MetalLB) when it runs outside the cluster, or none for the Pod IP (needs routes to ' +
        'the Pod network)',
    );
  }
  if (!['', 'none', 'ClusterIP', 'LoadBalancer'].includes(serviceType)) {
    throw new MappingError(`MW_SERVICE_TYPE must be ClusterIP, LoadBalancer or none, not ${serviceType}`);
  }
  const annotations = {};
  for (const pair of (env.MW_SERVICE_ANNOTATIONS || '').split(',').filter(Boolean)) {
    const eq = pair.indexOf('=');
    if (eq <= 0) throw new MappingError(`MW_SERVICE_ANNOTATIONS: ${pair} is not KEY=VALUE`);
    annotations[pair.slice(0, eq).trim()] = pair.slice(eq + 1).trim();
  }
  return {
    requestsPercent: percent,
    rootfs: {
      mountPath: mountPath === '' || mountPath === 'none' ? null : mountPath,
      storageClass: env.MW_ROOTFS_STORAGE_CLASS || null,
      onDelete: onDelete === 'delete' ? 'Delete' : 'Retain',
    },
    service: {
      type: serviceType === '' || serviceType === 'none' ? null : serviceType,
      loadBalancerClass: env.MW_SERVICE_LOAD_BALANCER_CLASS || null,
      annotations,
    },
    systemImages:
      env.MW_SYSTEM_CONTAINER_IMAGES === undefined
        ? [MANAGER_TEMPLATES]
        : env.MW_SYSTEM_CONTAINER_IMAGES.split(',').map((p) => p.trim()).filter(Boolean),
    isolationAllowFrom: checkedIsolation((env.MW_ISOLATION_ALLOW_FROM || '').split(',')),
  };
}

/** The entries of MW_ISOLATION_ALLOW_FROM, trimmed; refused at once when one is not valid. */
function checkedIsolation(entries) {
  const list = entries.map((e) => e.trim()).filter(Boolean);
  isolation(list);
  return list;
}

/**
 * `spec.isolation` for every container (the bridge's `--isolation-allow-from`): connections
 * only to its ports, and only from `cidr:<range>` (the hosts of Manager's agent) or
 * `namespace:<name>` (every Pod there); `none` allows nothing. No entries: no isolation.
 */
function isolation(entries = []) {
  const list = entries.map((e) => e.trim()).filter(Boolean);
  if (list.length === 0) return null;
  if (list.length === 1 && list[0] === 'none') return {};
  return { allowFrom: list.map(peer) };
}

/** `spec` with `spec.isolation` as `settings` say (none: removed). */
function isolationFields(spec, settings) {
  const { isolation: _old, ...rest } = spec;
  const isolated = isolation(settings.isolationAllowFrom);
  return isolated ? { ...rest, isolation: isolated } : rest;
}

function peer(entry) {
  const colon = entry.indexOf(':');
  const [kind, value] = colon < 0 ? [entry, ''] : [entry.slice(0, colon), entry.slice(colon + 1)];
  if (kind === 'cidr' && isCidr(value)) return { cidr: value };
  if (kind === 'namespace' && isDnsLabel(value)) return { namespaceLabels: { 'kubernetes.io/metadata.name': value } };
  throw new MappingError(`MW_ISOLATION_ALLOW_FROM: ${JSON.stringify(entry)}: expected cidr:<address>/<bits>, namespace:<name> or none`);
}

function isCidr(range) {
  const slash = range.indexOf('/');
  if (slash < 0) return false;
  const bits = range.slice(slash + 1);
  if (!/^\d{1,3}$/.test(bits)) return false;
  const version = net.isIP(range.slice(0, slash));
  return (version === 4 && Number(bits) <= 32) || (version === 6 && Number(bits) <= 128);
}

/**
 * Manager's own templates (its UI's choices, images/ in its repository): Debian with systemd as
 * process 1, as LXC containers run on Proxmox. The bridge's default too.
 */
const MANAGER_TEMPLATES = 'ghcr.io/mieweb/opensource-server/';

/**
 * Whether `image` runs as a system container (spec.systemContainer): it starts with one of
 * `prefixes` (MW_SYSTEM_CONTAINER_IMAGES; Manager's templates when unset).
 */
function isSystemImage(image, prefixes = [MANAGER_TEMPLATES]) {
  return prefixes.some((prefix) => prefix && image.startsWith(prefix));
}

/** `^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`: Manager's hostname rule, also a CR name. */
function isDnsLabel(s) {
  return typeof s === 'string' && /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/.test(s);
}

/** Manager's `normalizeEnvVars` key rule. */
function validKey(key) {
  return /^[A-Za-z_][A-Za-z0-9_]*$/.test(key);
}

/**
 * Manager's env as it sends it to a provider (`buildLxcEnvConfig`: NUL-separated KEY=value
 * pairs, already merged and normalised), or a plain object, as a map.
 */
function parseEnv(env) {
  if (env == null || env === '') return {};
  if (typeof env === 'object') {
    const out = {};
    for (const [k, v] of Object.entries(env)) {
      if (!validKey(k)) throw new MappingError(`env key ${JSON.stringify(k)} is not a variable name`);
      out[k] = String(v);
    }
    return out;
  }
  const out = {};
  for (const pair of String(env).split('\0')) {
    if (pair === '') continue;
    const eq = pair.indexOf('=');
    const key = eq > 0 ? pair.slice(0, eq) : pair;
    if (eq <= 0 || !validKey(key)) throw new MappingError(`env entry ${JSON.stringify(key)} is not KEY=value`);
    out[key] = pair.slice(eq + 1);
  }
  return out;
}

/** The inverse of parseEnv, in key order (what `lxcConfig().env` returns). */
function joinEnv(env) {
  return sortedKeys(env)
    .map((k) => `${k}=${env[k]}`)
    .join('\0');
}

/** Keys in byte order, as Rust's BTreeMap<String, _> orders them. */
function sortedKeys(obj) {
  return Object.keys(obj).sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
}

/**
 * Split an entrypoint into words as the bridge does (the shell-words crate's `split`, POSIX
 * shell rules: quotes, backslashes, `#` comments). Unbalanced quotes are an error.
 */
function shellSplit(s) {
  const words = [];
  let word = '';
  let state = 'delimiter';
  const chars = Array.from(s);
  for (let i = 0; i <= chars.length; i++) {
    const c = i < chars.length ? chars[i] : null;
    const blank = c === ' ' || c === '\t' || c === '\n';
    switch (state) {
      case 'delimiter':
        if (c === null) return words;
        if (c === "'") state = 'single';
        else if (c === '"') state = 'double';
        else if (c === '\\') state = 'backslash';
        else if (blank) state = 'delimiter';
        else if (c === '#') state = 'comment';
        else {
          word += c;
          state = 'unquoted';
        }
        break;
      case 'backslash':
      case 'unquotedBackslash':
        if (c === null) {
          words.push(word + '\\');
          return words;
        }
        if (c === '\n') state = state === 'backslash' ? 'delimiter' : 'unquoted';
        else {
          word += c;
          state = 'unquoted';
        }
        break;
      case 'unquoted':
        if (c === null) {
          words.push(word);
          return words;
        }
        if (c === "'") state = 'single';
        else if (c === '"') state = 'double';
        else if (c === '\\') state = 'unquotedBackslash';
        else if (blank) {
          words.push(word);
          word = '';
          state = 'delimiter';
        } else word += c;
        break;
      case 'single':
        if (c === null) throw new MappingError('entrypoint has an unterminated single quote');
        if (c === "'") state = 'unquoted';
        else word += c;
        break;
      case 'double':
        if (c === null) throw new MappingError('entrypoint has an unterminated double quote');
        if (c === '"') state = 'unquoted';
        else if (c === '\\') state = 'doubleBackslash';
        else word += c;
        break;
      case 'doubleBackslash':
        if (c === null) throw new MappingError('entrypoint ends inside a double quote');
        if (c === '\n') state = 'double';
        else {
          word += '$`"\\'.includes(c) ? c : `\\${c}`;
          state = 'double';
        }
        break;
      case 'comment':
        if (c === null) return words;
        if (c === '\n') state = 'delimiter';
        break;
      default:
        throw new Error(`shellSplit: unknown state ${state}`);
    }
  }
  return words;
}

/** Words back into one string that shellSplit reads as the same words. */
function shellJoin(words) {
  return words.map((w) => (/^[A-Za-z0-9_@%+=:,./-]+$/.test(w) ? w : `'${w.replace(/'/g, `'\\''`)}'`)).join(' ');
}

/** Hex SHA-256 of the env, length-prefixed as mapping.rs `env_digest` hashes it. */
function envDigest(env) {
  const hash = crypto.createHash('sha256');
  const length = (buf) => {
    const b = Buffer.alloc(8);
    b.writeBigUInt64BE(BigInt(buf.length));
    return b;
  };
  for (const k of sortedKeys(env)) {
    const key = Buffer.from(k);
    const value = Buffer.from(env[k]);
    hash.update(length(key));
    hash.update(key);
    hash.update(length(value));
    hash.update(value);
  }
  return hash.digest('hex');
}

/**
 * Manager's http and transport Services rows as the workload's ports (mapping.rs `ports`):
 * one per distinct (port, protocol), in port order; `http-N`, `tcp-N`, `udp-N`; the first
 * service on a port names it. Other services (dns) have no port of their own.
 * @param {Array<{type: string, internalPort: number, protocol?: string}>} services
 */
function ports(services = []) {
  const byKey = new Map();
  for (const s of services) {
    const bad = (why) => new MappingError(`service (${s.type}, internalPort ${s.internalPort}): ${why}`);
    const number = Number(s.internalPort);
    let protocol;
    let prefix;
    if (s.type === 'http') [protocol, prefix] = ['TCP', 'http'];
    else if (s.type === 'transport' && s.protocol === 'tcp') [protocol, prefix] = ['TCP', 'tcp'];
    else if (s.type === 'transport' && s.protocol === 'udp') [protocol, prefix] = ['UDP', 'udp'];
    else if (s.type === 'transport') throw bad('a transport service needs protocol tcp or udp');
    else continue;
    if (!Number.isInteger(number) || number < 1 || number > 65535) throw bad('not a port number (1 to 65535)');
    const key = `${String(number).padStart(5, '0')}/${protocol}`;
    if (!byKey.has(key)) byKey.set(key, { containerPort: number, name: `${prefix}-${number}`, protocol });
  }
  if (byKey.size > MAX_PORTS) throw new MappingError('more than 64 distinct ports');
  return [...byKey.keys()].sort().map((k) => byKey.get(k));
}

function positive(name, value) {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new MappingError(`${name} (${value}) is not a positive whole number`);
  return n;
}

/** Limits as Manager grants them; requests a percentage of them (bridge --requests-percent). */
function resources(cores, memoryMb, nvidia, percent) {
  const p = Math.min(100, Math.max(1, percent));
  return {
    limits: { cpu: String(cores), memory: `${memoryMb}Mi` },
    requests: {
      cpu: `${Math.max(1, Math.floor((cores * 1000 * p) / 100))}m`,
      memory: `${Math.max(1, Math.floor((memoryMb * p) / 100))}Mi`,
    },
    // nvidiaRequested is a yes/no in Manager: one GPU.
    ...(nvidia ? { gpus: 1 } : {}),
  };
}

function rootfsVolumes(gb, rootfs) {
  if (!rootfs.mountPath) return [];
  return [
    {
      name: ROOTFS_VOLUME,
      mountPath: rootfs.mountPath,
      size: `${gb}Gi`,
      ...(rootfs.storageClass ? { storageClassName: rootfs.storageClass } : {}),
      retentionPolicy: rootfs.onDelete,
    },
  ];
}

function envRefs(env, secretName) {
  return sortedKeys(env).map((key) => ({ name: key, valueFrom: { secretKeyRef: { name: secretName, key } } }));
}

/** Identity labels (docs/resource.md) and this provider's mark. */
function labels(nodeId, containerId) {
  return {
    [NODE_ID_LABEL]: String(nodeId),
    [CONTAINER_ID_LABEL]: String(containerId),
    [PROVIDER_LABEL]: PROVIDER_VALUE,
  };
}

/**
 * The ManagedWorkload and env Secret for one container.
 * @param {object} c what Manager's create job knows
 * @param {string} c.namespace the node's namespace
 * @param {number|string} c.nodeId Nodes.id
 * @param {number|string} c.containerId Containers.id (Manager's row id, not the provider id)
 * @param {string} c.hostname Containers.hostname: the workload's name
 * @param {string} [c.username] the owner, kept as an annotation for people reading the CR
 * @param {string} c.image Containers.template
 * @param {string} [c.entrypoint] one string, split as a shell would
 * @param {string|object} [c.env] the effective env (Manager's NUL-joined form or an object)
 * @param {number} [c.cores] [c.memory] (MB) [c.rootfs] (GB): the approved resources
 * @param {boolean} [c.nvidia] one GPU
 * @param {Array} [c.services] Manager's Services rows: {type, internalPort, protocol}
 * @param {object} settings settingsFromEnv()
 * @returns {{workload: object, secret: object, env: object}}
 */
function desired(c, settings) {
  if (!isDnsLabel(c.hostname)) {
    throw new MappingError(`hostname ${JSON.stringify(c.hostname)} is not a valid Kubernetes name (RFC 1123 label, at most 63 characters)`);
  }
  const image = typeof c.image === 'string' ? c.image.trim() : '';
  if (!image || /\s/.test(image)) throw new MappingError(`image ${JSON.stringify(c.image)} is not a container image reference`);
  const entrypoint = typeof c.entrypoint === 'string' ? c.entrypoint.trim() : '';
  // An empty entrypoint keeps the image's own, as in Manager.
  const command = entrypoint ? shellSplit(entrypoint) : [];
  const env = parseEnv(c.env);
  const cores = positive('cores', c.cores ?? DEFAULT_CPUS);
  const memory = positive('memory', c.memory ?? DEFAULT_MEMORY_MB);
  const rootfs = positive('rootfs', c.rootfs ?? DEFAULT_ROOTFS_GB);
  const secretName = `${c.hostname}${SECRET_SUFFIX}`;
  const workloadPorts = ports(c.services);
  const service = serviceOf(workloadPorts, settings);
  const spec = {
    image,
    ...(command.length ? { command } : {}),
    ...(Object.keys(env).length ? { env: envRefs(env, secretName) } : {}),
    resources: resources(cores, memory, !!c.nvidia, settings.requestsPercent),
    hostname: c.hostname,
    podAnnotations: { [ENV_DIGEST_ANNOTATION]: envDigest(env) },
  };
  const volumes = rootfsVolumes(rootfs, settings.rootfs);
  if (volumes.length) spec.volumes = volumes;
  if (workloadPorts.length) spec.ports = workloadPorts;
  if (service) spec.service = service;
  if (isSystemImage(image, settings.systemImages)) spec.systemContainer = {};
  const workload = {
    apiVersion: `${GROUP}/${VERSION}`,
    kind: KIND,
    metadata: {
      name: c.hostname,
      namespace: c.namespace,
      labels: labels(c.nodeId, c.containerId),
      ...(c.username ? { annotations: { [OWNER_ANNOTATION]: c.username } } : {}),
    },
    spec: isolationFields(spec, settings),
  };
  return { workload, secret: secret(c, env), env };
}

/** `spec.service` for these ports: none without ports or with MW_SERVICE_TYPE=none. */
function serviceOf(workloadPorts, settings) {
  if (!settings.service.type || workloadPorts.length === 0) return null;
  return {
    type: settings.service.type,
    ...(settings.service.type === 'LoadBalancer' && settings.service.loadBalancerClass
      ? { loadBalancerClass: settings.service.loadBalancerClass }
      : {}),
    ...(Object.keys(settings.service.annotations).length ? { annotations: { ...settings.service.annotations } } : {}),
  };
}

/**
 * The spec with the ports and Service of Manager's current Services rows, exactly as
 * `desired` makes them (a container whose services changed after create).
 */
function portFields(spec, services, settings) {
  const workloadPorts = ports(services);
  const service = serviceOf(workloadPorts, settings);
  // Keys keep their place: the same services give the same spec (no new generation).
  const next = { ...spec, ports: workloadPorts, service };
  if (!workloadPorts.length) delete next.ports;
  if (!service) delete next.service;
  return next;
}

/** The env Secret of a container: values only ever here, never in the CR. */
function secret(c, env) {
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name: `${c.hostname}${SECRET_SUFFIX}`, namespace: c.namespace, labels: labels(c.nodeId, c.containerId) },
    type: 'Opaque',
    data: Object.fromEntries(sortedKeys(env).map((k) => [k, Buffer.from(env[k]).toString('base64')])),
  };
}

/** The spec fields that carry the env, for a workload whose env changed. */
function envFields(spec, env, secretName) {
  const next = { ...spec, podAnnotations: { ...(spec.podAnnotations || {}), [ENV_DIGEST_ANNOTATION]: envDigest(env) } };
  if (Object.keys(env).length) next.env = envRefs(env, secretName);
  else delete next.env;
  return next;
}

/**
 * Manager's status for a workload (utils/container-status.js words). Only status written for
 * the current generation counts: right after a change, the old phase describes the old spec.
 */
function managerStatus(mw) {
  if (!mw) return 'missing';
  const status = mw.status || {};
  if (status.observedGeneration !== mw.metadata?.generation) {
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
    default:
      return 'creating';
  }
}

/** The workload's condition of `type` when it was computed for `generation` or later. */
function conditionAt(mw, type, generation) {
  if ((mw.status?.observedGeneration ?? -1) < generation) return undefined;
  return (mw.status.conditions || []).find((c) => c.type === type && (c.observedGeneration ?? -1) >= generation);
}

/** "namespace/name" → {namespace, name}. */
function parseProviderId(providerId) {
  const parts = String(providerId).split('/');
  if (parts.length !== 2 || !parts[0] || !parts[1]) {
    throw new MappingError(`not a Kubernetes provider id (namespace/name): ${providerId}`);
  }
  return { namespace: parts[0], name: parts[1] };
}

/**
 * Task ids: what a write asked for, so `waitForTask` in another call (or process) knows what
 * to wait for. `k8s:<op>:<namespace>/<name>:<generation>`.
 */
function taskId(op, namespace, name, generation) {
  return `k8s:${op}:${namespace}/${name}:${generation}`;
}

function parseTaskId(id) {
  const m = /^k8s:([a-z]+):([^/:]+)\/([^/:]+):(\d+)$/.exec(String(id));
  if (!m) throw new MappingError(`not a Kubernetes task id: ${id}`);
  return { op: m[1], namespace: m[2], name: m[3], generation: Number(m[4]) };
}

module.exports = {
  GROUP,
  VERSION,
  PLURAL,
  KIND,
  NODE_ID_LABEL,
  CONTAINER_ID_LABEL,
  SYNCED_BY_LABEL,
  PROVIDER_LABEL,
  PROVIDER_VALUE,
  OWNER_ANNOTATION,
  ENV_DIGEST_ANNOTATION,
  SECRET_SUFFIX,
  isolation,
  isolationFields,
  ROOTFS_VOLUME,
  DEFAULT_CPUS,
  DEFAULT_MEMORY_MB,
  DEFAULT_ROOTFS_GB,
  MANAGER_TEMPLATES,
  MappingError,
  settingsFromEnv,
  isSystemImage,
  isDnsLabel,
  parseEnv,
  joinEnv,
  shellSplit,
  shellJoin,
  envDigest,
  ports,
  resources,
  desired,
  secret,
  envFields,
  portFields,
  labels,
  managerStatus,
  conditionAt,
  parseProviderId,
  taskId,
  parseTaskId,
};
