// The shared mapping table (../mapping-cases.json) and what Manager's create job passes the
// provider for one of its cases: for the provider's tests.
'use strict';

const fs = require('node:fs');
const path = require('node:path');

const m = require('../lib/mapping');

const table = JSON.parse(fs.readFileSync(path.join(__dirname, '..', 'mapping-cases.json'), 'utf8'));

/** createLxc's options for the case's row, as the patched create job builds them. */
function managerCall(c) {
  return {
    containerId: c.row.id,
    hostname: c.row.hostname,
    username: c.row.username,
    image: c.row.template,
    entrypoint: c.row.entrypoint,
    // buildLxcEnvConfig's NUL-joined string, in Manager's merge order.
    env: Object.entries(c.managerEnv).map(([k, v]) => `${k}=${v}`).join('\0'),
    // `approvedResources.cpus || 4` and so on, as the job computes them.
    cores: c.grants.cpus || m.DEFAULT_CPUS,
    memory: c.grants.memory || m.DEFAULT_MEMORY_MB,
    rootfs: c.grants.rootfs || m.DEFAULT_ROOTFS_GB,
    nvidia: c.row.nvidiaRequested,
    services: c.services,
  };
}

module.exports = { table, managerCall };
