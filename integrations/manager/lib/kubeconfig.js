'use strict';
// Where a kubernetes node's credentials come from, and what may be said about them.
//
// A node names its kubeconfig (kubeconfigPath). Nothing is taken from Manager's own account
// ($KUBECONFIG, ~/.kube/config): that identity may hold far more than rbac/role.yaml. The
// in-cluster ServiceAccount is used only when Manager's environment says so. A kubeconfig that
// would run a program (exec, auth-provider) or skip TLS verification is refused unless
// Manager's environment opts in; one with a proxy is refused always, as mw-operator refuses it.
//
// Errors say which file and what is wrong, never the file's text: Manager copies them into the
// job's output, which the container's owner (not an administrator) reads.

const fs = require('fs');
const path = require('path');
const k8s = require('@kubernetes/client-node');

/** Manager's environment: a node without kubeconfigPath uses the Pod's ServiceAccount. */
const IN_CLUSTER = 'MW_KUBECONFIG_IN_CLUSTER';
/** Manager's environment: a kubeconfig user may have `exec` (runs a program). */
const ALLOW_EXEC = 'MW_KUBECONFIG_ALLOW_EXEC';
/** Manager's environment: a kubeconfig user may have `auth-provider` (gcp and azure run one too). */
const ALLOW_AUTH_PROVIDER = 'MW_KUBECONFIG_ALLOW_AUTH_PROVIDER';
/** Manager's environment: a kubeconfig cluster may have `insecure-skip-tls-verify: true`. */
const ALLOW_INSECURE_TLS = 'MW_KUBECONFIG_ALLOW_INSECURE_TLS';

/** Where client-node's loadFromCluster finds the ServiceAccount's token. */
const SERVICEACCOUNT_TOKEN = '/var/run/secrets/kubernetes.io/serviceaccount/token';

/**
 * A node's kubeconfig cannot be used; the message names the file and the field. `field` is the
 * node's field at fault (kubeContext when it names what the file lacks), for Manager's nodes API.
 */
class KubeconfigError extends Error {
  constructor(message, field = 'kubeconfigPath') {
    super(message);
    this.name = 'KubeconfigError';
    this.field = field;
  }
}

/**
 * `text` with credentials taken out: the exact `secrets` given, and whatever looks like one
 * (a bearer or basic credential, `token: …`, `password: …`, `client-key-data: …`, a JWT, a
 * private key, a password in a URL).
 * @param {string} text
 * @param {string[]} [secrets] values known to be credentials (a kubeconfig's token, password, key)
 */
function redact(text, secrets = []) {
  let s = String(text);
  for (const v of secrets) if (v) s = s.split(v).join('[redacted]');
  return s
    .replace(/-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)/g, '[redacted]')
    .replace(/\b(Bearer|Basic)\s+(?!\[redacted\])[^\s"'<>,;]+/gi, '$1 [redacted]')
    .replace(
      /("?\b(?:token|id-token|refresh-token|access-token|password|client-key-data|client-secret|authorization)"?\s*[:=]\s*)(?!\[redacted\])("[^"]*"?|'[^']*'?|[^\s"'<>,;}]+)/gi,
      '$1[redacted]',
    )
    .replace(/\beyJ[\w-]{4,}\.[\w-]{4,}\.[\w-]*/g, '[redacted]')
    .replace(/\b([a-z][a-z0-9+.-]*:\/\/)[^\s/@]+@/gi, '$1[redacted]@');
}

/** What a kubeconfig holds that must never be repeated: tokens, passwords, keys. */
function secretsOf(kc) {
  const out = [];
  for (const u of kc.getUsers() || []) {
    out.push(u.token, u.password, u.keyData);
    for (const v of Object.values(u.authProvider?.config || {})) out.push(v);
    for (const e of u.exec?.env || []) out.push(e?.value);
  }
  // Short values would blank ordinary words; none of a real credential's is this short.
  return [...new Set(out.filter((v) => typeof v === 'string' && v.length >= 4))];
}

/**
 * The node's KubeConfig, its context set, checked against the rules above.
 * @param {object} node the Node row: id, name, kubeconfigPath, kubeContext
 * @param {object} [opts]
 * @param {string} [opts.text] a kubeconfig's text, instead of node.kubeconfigPath (tests)
 * @param {object} [opts.env] Manager's environment, for the MW_KUBECONFIG_* opt-ins (default process.env)
 * @param {string} [opts.pathPrefix] prefixed to the ServiceAccount's files (tests)
 * @returns {{kc: k8s.KubeConfig, secrets: string[]}} the config, and its credentials for redact()
 */
function loadKubeConfig(node, { text, env = process.env, pathPrefix = '' } = {}) {
  const kc = new k8s.KubeConfig();
  const nodeName = `node ${node.name ?? node.id}`;
  if (text == null && !node.kubeconfigPath) {
    // The ServiceAccount is Manager's own (its Pod's), not a node's, and the nodes API takes
    // only an absolute path as kubeconfigPath: so choosing it is a setting of Manager's process.
    if (env[IN_CLUSTER] !== '1') {
      throw new KubeconfigError(
        `${nodeName} has no kubeconfigPath: set it to a kubeconfig file on Manager's host ` +
          `(or, with Manager in a Pod, set ${IN_CLUSTER}=1 in Manager's environment to use its ServiceAccount)`,
      );
    }
    if (node.kubeContext) {
      throw new KubeconfigError(
        `${nodeName}: kubeContext ${JSON.stringify(node.kubeContext)} needs a kubeconfigPath; the in-cluster ServiceAccount has no contexts`,
        'kubeContext',
      );
    }
    // client-node reads the address from process.env, so that is what is checked.
    const token = `${pathPrefix}${SERVICEACCOUNT_TOKEN}`;
    if (!process.env.KUBERNETES_SERVICE_HOST || !fs.existsSync(token)) {
      throw new KubeconfigError(`${nodeName}: ${IN_CLUSTER}=1, but Manager does not run in a Pod (no KUBERNETES_SERVICE_HOST or no ${token})`);
    }
    kc.loadFromCluster(pathPrefix);
    return { kc, secrets: [] };
  }

  const where = text != null ? 'the given kubeconfig' : `kubeconfig ${node.kubeconfigPath}`;
  let content = text;
  if (content == null) {
    try {
      content = fs.readFileSync(node.kubeconfigPath, 'utf8');
    } catch (err) {
      throw new KubeconfigError(`${where}: file not readable: ${err.code || err.name}`);
    }
  }
  parse(kc, content, where);
  if (text == null) kc.makePathsAbsolute(path.dirname(node.kubeconfigPath));
  const secrets = secretsOf(kc);
  const fail = (problem, field) => new KubeconfigError(redact(`${where}: ${problem}`, secrets), field);

  const contextName = node.kubeContext || kc.getCurrentContext();
  if (!contextName) throw fail("no current context (set its current-context, or the node's kubeContext)");
  const context = kc.getContextObject(contextName);
  if (!context) {
    throw node.kubeContext
      ? fail(`no context named ${JSON.stringify(contextName)} (the node's kubeContext)`, 'kubeContext')
      : fail(`no context named ${JSON.stringify(contextName)} (its current-context)`);
  }
  kc.setCurrentContext(contextName);
  const cluster = kc.getCluster(context.cluster);
  if (!cluster) throw fail(`context ${JSON.stringify(contextName)} names cluster ${JSON.stringify(context.cluster)}, which it does not have`);
  const user = context.user ? kc.getUser(context.user) : null;
  if (context.user && !user) throw fail(`context ${JSON.stringify(contextName)} names user ${JSON.stringify(context.user)}, which it does not have`);

  // Only what this context uses: client-node never runs another user's plugin.
  const c = `cluster ${JSON.stringify(cluster.name)}`;
  if (cluster.proxyUrl) {
    throw fail(`${c} has proxy-url (clusters[].cluster.proxy-url): the provider, like mw-operator, connects to the API server directly; remove it`);
  }
  if (cluster.skipTLSVerify && env[ALLOW_INSECURE_TLS] !== '1') {
    throw fail(
      `${c} has insecure-skip-tls-verify: true (clusters[].cluster.insecure-skip-tls-verify), which would send the credentials to any server; ` +
        `give it certificate-authority-data instead, or set ${ALLOW_INSECURE_TLS}=1 in Manager's environment`,
    );
  }
  const u = user && `user ${JSON.stringify(user.name)}`;
  if (user?.exec && env[ALLOW_EXEC] !== '1') {
    throw fail(
      `${u} has exec (users[].user.exec), a credential plugin that runs a program on Manager's host; ` +
        `use a token or a client certificate, or set ${ALLOW_EXEC}=1 in Manager's environment`,
    );
  }
  if (user?.authProvider && env[ALLOW_AUTH_PROVIDER] !== '1') {
    throw fail(
      `${u} has auth-provider (users[].user.auth-provider), a plugin that may run a program on Manager's host; ` +
        `use a token or a client certificate, or set ${ALLOW_AUTH_PROVIDER}=1 in Manager's environment`,
    );
  }
  return { kc, secrets };
}

/** Load `content` into `kc`; an error says what kind of problem, never the text. */
function parse(kc, content, where) {
  try {
    kc.loadFromString(content);
  } catch (err) {
    // js-yaml's message quotes the lines around the fault, and tag and alias names (a token
    // written as `!abc…` or `*abc…` is one), so only the position is kept.
    if (err.name === 'YAMLException') {
      const at = err.mark ? ` at line ${err.mark.line + 1}, column ${err.mark.column + 1}` : '';
      throw new KubeconfigError(`${where}: not valid YAML${at}`);
    }
    // A user's token-file, which client-node reads as it loads.
    if (err.code && err.syscall) throw new KubeconfigError(`${where}: a file it names is not readable: ${err.code}`);
    // client-node's own words name only the field: "clusters[0].cluster.server is missing".
    if (/^(clusters|users|contexts)\[\d+\](\.\w+)* is missing$/.test(err.message)) {
      throw new KubeconfigError(`${where}: ${err.message}`);
    }
    throw new KubeconfigError(`${where}: not a kubeconfig (its clusters, users and contexts could not be read)`);
  }
}

module.exports = {
  ALLOW_AUTH_PROVIDER,
  ALLOW_EXEC,
  ALLOW_INSECURE_TLS,
  IN_CLUSTER,
  KubeconfigError,
  loadKubeConfig,
  redact,
};
