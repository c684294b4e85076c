'use strict';
// Manager's Kubernetes provider. In Manager (with integrations/manager/patches applied),
// models/node.js returns `new KubernetesApi(node)` for nodes of type `kubernetes`, reads
// `KubernetesApi.capabilities`, and calls `checkNode` before the nodes API saves such a node.
const { KubernetesApi, KubernetesError } = require('./lib/kubernetes-api');
const { NodeCheckError, checkNode } = require('./lib/check');
const { KubeconfigError } = require('./lib/kubeconfig');
const mapping = require('./lib/mapping');

module.exports = { KubernetesApi, KubernetesError, KubeconfigError, NodeCheckError, checkNode, mapping };
