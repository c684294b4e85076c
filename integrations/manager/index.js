'use strict';
// Manager's Kubernetes provider. In Manager (with integrations/manager/patches applied),
// models/node.js returns `new KubernetesApi(node)` for nodes of type `kubernetes`.
const { KubernetesApi, KubernetesError } = require('./lib/kubernetes-api');
const { KubeconfigError } = require('./lib/kubeconfig');
const mapping = require('./lib/mapping');

module.exports = { KubernetesApi, KubernetesError, KubeconfigError, mapping };
