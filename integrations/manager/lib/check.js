'use strict';
// Before Manager saves a kubernetes node (the patch's nodes router, on create and on edit): can
// its jobs work with it? Its kubeconfig passes the provider's rules, its API server answers and
// accepts the credentials, serves ManagedWorkloads, the namespace exists, and Manager's identity
// may do there all that rbac/role.yaml grants. A refusal names the node's field at fault and
// keeps the API server's own words, credentials taken out: the nodes API shows it on that field,
// so an administrator learns of a typo when saving, not from a container's failed create job.

const fs = require('fs');
const path = require('path');
const k8s = require('@kubernetes/client-node');
const m = require('./mapping');
const { KubeconfigError, loadKubeConfig, redact } = require('./kubeconfig');
const { explain } = require('./kubernetes-api');

/** How long each request may take: an API server that drops packets would hold the save for minutes. */
const TIMEOUT_MS = 10_000;

/** What Manager's identity needs in the namespace: each permission of rbac/role.yaml, its one source. */
const NEEDED = k8s
  .loadYaml(fs.readFileSync(path.join(__dirname, '..', 'rbac', 'role.yaml'), 'utf8'))
  .rules.flatMap((r) => r.apiGroups.flatMap((group) => r.resources.flatMap((resource) => r.verbs.map((verb) => ({ group, resource, verb })))));

/**
 * A node Manager's jobs could not work with: `field` is the node's field at fault, `code` what is
 * wrong. `status` and `fields` are the shape Manager's API error handler answers with (400).
 */
class NodeCheckError extends Error {
  constructor(code, field, message) {
    super(message);
    this.name = 'NodeCheckError';
    this.code = code;
    this.field = field;
    this.status = 400;
    this.fields = { [field]: message };
  }
}

/** Call options that abort a request after `ms` (client-node's middleware, as setHeaderOptions makes). */
function timeout(ms) {
  const pre = (request) => {
    request.setSignal(AbortSignal.timeout(ms));
    return new k8s.Observable(Promise.resolve(request));
  };
  return { middleware: [{ pre, post: (response) => new k8s.Observable(Promise.resolve(response)) }], middlewareMergeStrategy: 'append' };
}

/**
 * Check a kubernetes node's connection fields before they are saved. Resolves when Manager's
 * jobs can work with the node; otherwise rejects with a NodeCheckError:
 *   invalid_kubeconfig        kubeconfigPath or kubeContext: the file, or its context, cannot be used
 *   kube_unreachable          kubeconfigPath: no answer (refused, TLS, DNS, timeout, 5xx)
 *   kube_unauthorized         kubeconfigPath: the API server refused the credentials (401)
 *   kube_crd_missing          kubeconfigPath: that cluster serves no ManagedWorkloads (mw-operator's CRD)
 *   kube_forbidden            kubeNamespace: Manager's identity may not do there what rbac/role.yaml grants
 *   kube_namespace_not_found  kubeNamespace: no such namespace
 *   invalid_kube_namespace    kubeNamespace: none given
 * Any other error (a bug, not the node's fields) is thrown as it is.
 * @param {object} node the fields to save: name, kubeconfigPath, kubeContext, kubeNamespace
 * @param {object} [opts]
 * @param {string} [opts.kubeconfig] a kubeconfig's text, instead of node.kubeconfigPath (tests)
 * @param {object} [opts.env] Manager's environment, for the MW_KUBECONFIG_* opt-ins (default process.env)
 * @param {number} [opts.timeoutMs] per request (default 10 s)
 */
async function checkNode(node, { kubeconfig, env = process.env, timeoutMs = TIMEOUT_MS } = {}) {
  const namespace = node.kubeNamespace;
  if (!namespace) throw new NodeCheckError('invalid_kube_namespace', 'kubeNamespace', 'kubeNamespace is required');
  let kc;
  let secrets;
  try {
    ({ kc, secrets } = loadKubeConfig(node, { text: kubeconfig, env }));
  } catch (err) {
    if (err instanceof KubeconfigError) throw new NodeCheckError('invalid_kubeconfig', err.field, err.message);
    throw err;
  }
  const server = kc.getCurrentCluster().server;
  const options = timeout(timeoutMs);
  // A failed request as the refusal of the field it concerns, in the API server's words
  // (explain keeps only its message, credentials taken out), or why it said none.
  const refused = (err, what, hint = '') => {
    const words = err?.name === 'AbortError' ? `${what}: no answer within ${timeoutMs / 1000} s` : explain(err, what, secrets).message;
    if (err.code === 401) return new NodeCheckError('kube_unauthorized', 'kubeconfigPath', words);
    if (err.code === 403) return new NodeCheckError('kube_forbidden', 'kubeNamespace', words + hint);
    return new NodeCheckError('kube_unreachable', 'kubeconfigPath', words);
  };

  // Reached, authenticated, the CRD served and listable in the namespace: one request says all.
  const listing = `listing ${m.PLURAL} in namespace ${namespace} at ${server}`;
  try {
    const custom = kc.makeApiClient(k8s.CustomObjectsApi);
    await custom.listNamespacedCustomObject({ group: m.GROUP, version: m.VERSION, plural: m.PLURAL, namespace, limit: 1 }, options);
  } catch (err) {
    if (err.code === 404) {
      const words = explain(err, listing, secrets).message;
      throw new NodeCheckError('kube_crd_missing', 'kubeconfigPath', `${words}; is mw-operator's CRD installed in that cluster?`);
    }
    // A Role can be bound only in a namespace that exists, so to Manager's own identity a
    // missing namespace looks exactly like one it is not bound in.
    throw refused(err, listing, `; is namespace ${namespace} there, with rbac/role.yaml bound in it to this kubeconfig's identity?`);
  }

  // The namespace exists. An identity allowed in every namespace (a ClusterRoleBinding) lists
  // an empty one where there is none; one that may not read namespaces (403) was allowed to
  // list above only through a RoleBinding, which exists only in a namespace that exists.
  try {
    await kc.makeApiClient(k8s.CoreV1Api).readNamespace({ name: namespace }, options);
  } catch (err) {
    const reading = `reading namespace ${namespace}`;
    if (err.code === 404) throw new NodeCheckError('kube_namespace_not_found', 'kubeNamespace', explain(err, reading, secrets).message);
    if (err.code !== 403) throw refused(err, reading);
  }

  // The rest of the Role: a create job writes Secrets and workloads, a delete deletes them.
  // Every authenticated identity may ask about itself (SelfSubjectAccessReview).
  const authz = kc.makeApiClient(k8s.AuthorizationV1Api);
  const answers = await Promise.all(
    NEEDED.map(async (attributes) => {
      try {
        const review = await authz.createSelfSubjectAccessReview({ body: { spec: { resourceAttributes: { namespace, ...attributes } } } }, options);
        return { ...attributes, allowed: !!review.status?.allowed, reason: review.status?.reason };
      } catch (err) {
        throw refused(err, `asking whether Manager's identity may ${attributes.verb} ${attributes.resource} in namespace ${namespace}`);
      }
    }),
  );
  const denied = answers.filter((a) => !a.allowed);
  if (denied.length) {
    const what = denied.map((a) => `${a.verb} ${a.resource}${a.reason ? ` (${a.reason})` : ''}`).join(', ');
    const message = `Manager's identity at ${server} may not ${what} in namespace ${namespace}: bind rbac/role.yaml to it there`;
    throw new NodeCheckError('kube_forbidden', 'kubeNamespace', redact(message, secrets));
  }
}

module.exports = { NodeCheckError, checkNode };
