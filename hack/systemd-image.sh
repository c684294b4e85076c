#!/usr/bin/env bash
# Debian 13 images for the real node, built without a registry or a container engine:
# debootstrap (minbase) from Debian's mirror, then one layer in an OCI archive (hack/oci.py).
# Their names are under mw-test.invalid (no registry can serve them, as the other test images).
#
#   hack/systemd-image.sh         the system-container test image; prints the archive's path
#   hack/systemd-image.sh agent   Manager's agent image (needs MANAGER_SRC); prints its path
#
# The test image, mw-test.invalid/systemd:1, is what Manager's own templates are (images/base in
# Manager's repository: Debian 13, ENTRYPOINT /sbin/init, STOPSIGNAL SIGRTMIN+3) with systemd
# and sshd. For the tests to look inside without exec, a unit serves busybox httpd on port 8080
# with two CGI scripts: /cgi-bin/state (systemd's state, sshd's, the hostname, /data/mark) and
# /cgi-bin/mark (writes its query string to /data/mark, the workload's volume). The same layer
# is also mw-test.invalid/sshd:1, sshd alone as process 1 (an ordinary container), trusting the
# key in its SSH_AUTHORIZED_KEY env variable for root: a Manager user's SSH target.
#
# The agent image, mw-test.invalid/opensource-agent:1, is Manager's images/agent built from
# Debian's packages instead of Proxmox's template and NodeSource: systemd, dbus, nginx with its
# stream module, ssl-cert, dnsmasq and nodejs (the agent package's dependencies, from its .fpm),
# then Manager's agent installed by its own Makefile (`make install`, which runs `npm ci`, `tsc`
# and `npm prune`) and enabled as its package's postinstall does, Manager's environment.service
# (images/base: the container's env into /etc/environment, where the agent reads SITE_ID,
# MANAGER_URL and API_KEY) and images/agent's dnsmasq setting. What stands in: a self-signed
# certificate for the domain agent.mw-test.invalid, where Manager's image gets one from an ACME
# CA this machine cannot reach, and one-line error pages where MANAGER_SRC has none.
#
# Cached under ~/.cache/mw-operator/systemd-image/<key>, the key a digest of this script,
# hack/oci.py and (for the agent) Manager's agent sources: a change of any builds a new one.
# Needs root (debootstrap); about a minute for the test image, two for the agent's.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CACHE_ROOT=${MW_CACHE_DIR:-$HOME/.cache/mw-operator}
SUITE=trixie
MIRROR=${MW_DEBIAN_MIRROR:-http://deb.debian.org/debian}
WHICH=${1:-test}
AGENT_DOMAIN=agent.mw-test.invalid

case "$WHICH" in
  test)
    packages=systemd,systemd-sysv,dbus,openssh-server
    sources=() ;;
  agent)
    MANAGER_SRC=${MANAGER_SRC:-$REPO/../shared/manager/opensource-server}
    [ -f "$MANAGER_SRC/agent/Makefile" ] || { echo "no Manager agent at MANAGER_SRC=$MANAGER_SRC/agent" >&2; exit 1; }
    packages=systemd,systemd-sysv,dbus,nginx,libnginx-mod-stream,ssl-cert,dnsmasq,nodejs
    sources=("$MANAGER_SRC/agent" "$MANAGER_SRC/images/base/environment.sh" "$MANAGER_SRC/images/base/environment.service") ;;
  *) echo "usage: systemd-image.sh [test|agent]" >&2; exit 2 ;;
esac

key=$( {
  cat "$0" "$HERE/oci.py"
  for src in "${sources[@]}"; do
    find "$src" -type f -not -path '*/node_modules/*' -not -path '*/dist/*' -not -path '*/.pkg/*' | sort | xargs cat
  done
} | sha256sum | cut -c1-12)
dir="$CACHE_ROOT/systemd-image/$key"
archive="$dir/$WHICH.tar"
if [ -s "$archive" ]; then
  echo "$archive"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is missing: run hack/ensure-tools.sh" >&2; exit 1; }
[ -x /bin/busybox ] || { echo "busybox-static is missing: run hack/ensure-tools.sh" >&2; exit 1; }

tmp="$dir.partial.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
rootfs="$tmp/rootfs"
echo "[systemd-image] debootstrap $SUITE (minbase, $packages) into $rootfs" >&2
# debootstrap replaces start-stop-daemon with a stub while it installs, so no package's
# service starts on this host.
debootstrap --variant=minbase --include="$packages" "$SUITE" "$rootfs" "$MIRROR" >"$tmp/debootstrap.log" 2>&1 ||
  { tail -20 "$tmp/debootstrap.log" >&2; exit 1; }

# `systemctl enable UNIT_PATH` as offline symlinks (this host runs no systemd to ask).
enable_unit() {
  local unit=$1 target=$2
  mkdir -p "$rootfs/etc/systemd/system/$target.wants"
  ln -sf "$unit" "$rootfs/etc/systemd/system/$target.wants/$(basename "$unit")"
}

if [ "$WHICH" = test ]; then
  # The test's window into the machine.
  install -D -m 0755 /bin/busybox "$rootfs/usr/local/bin/busybox"
  install -d "$rootfs/www/cgi-bin" "$rootfs/data"
  cat >"$rootfs/www/cgi-bin/state" <<'SH'
#!/bin/sh
printf 'Content-Type: text/plain\r\n\r\n'
echo "system: $(systemctl is-system-running)"
echo "ssh: $(systemctl is-active ssh.service)"
echo "hostname: $(hostname)"
echo "mark: $(cat /data/mark 2>/dev/null)"
SH
  cat >"$rootfs/www/cgi-bin/mark" <<'SH'
#!/bin/sh
printf '%s\n' "$QUERY_STRING" >/data/mark && sync
printf 'Content-Type: text/plain\r\n\r\nmarked\n'
SH
  chmod 0755 "$rootfs/www/cgi-bin/state" "$rootfs/www/cgi-bin/mark"
  cat >"$rootfs/etc/systemd/system/mw-test-httpd.service" <<'UNIT'
[Unit]
Description=mw-test: the machine's state over HTTP on port 8080
After=multi-user.target ssh.service

[Service]
ExecStart=/usr/local/bin/busybox httpd -f -p 8080 -h /www

[Install]
WantedBy=default.target
UNIT
  enable_unit /etc/systemd/system/mw-test-httpd.service default.target
  # sshd alone, for the sshd:1 name: root logs in with the key its env names, nothing else.
  cat >"$rootfs/usr/local/bin/mw-test-sshd" <<'SH'
#!/bin/sh
set -e
mkdir -p /run/sshd /root/.ssh
printf '%s\n' "${SSH_AUTHORIZED_KEY:?SSH_AUTHORIZED_KEY: the public key root accepts}" >/root/.ssh/authorized_keys
chmod 0700 /root/.ssh && chmod 0600 /root/.ssh/authorized_keys
exec /usr/sbin/sshd -D -e -o PasswordAuthentication=no -o PermitRootLogin=prohibit-password
SH
  chmod 0755 "$rootfs/usr/local/bin/mw-test-sshd"
else
  echo "[systemd-image] Manager's agent: make install (npm ci, tsc, npm prune) into the image" >&2
  # The Makefile reads ../error-pages beside agent/, as in Manager's tree.
  mkdir -p "$tmp/manager"
  cp -r "$MANAGER_SRC/agent" "$tmp/manager/"
  if [ -d "$MANAGER_SRC/error-pages" ]; then
    cp -r "$MANAGER_SRC/error-pages" "$tmp/manager/"
  else
    # A tree without Manager's error pages (the copy in ../shared has none): one line each.
    mkdir "$tmp/manager/error-pages"
    for page in 403 404 502 auth-unavailable; do
      echo "<html><body>$page</body></html>" >"$tmp/manager/error-pages/$page.html"
    done
  fi
  rm -rf "$tmp/manager/agent/node_modules" "$tmp/manager/agent/dist"
  make -C "$tmp/manager/agent" install DESTDIR="$rootfs" >"$tmp/agent-build.log" 2>&1 ||
    { tail -30 "$tmp/agent-build.log" >&2; exit 1; }
  # What the package's postinstall does (`systemctl enable opensource-agent.timer`).
  enable_unit /usr/lib/systemd/system/opensource-agent.timer timers.target
  install -m 0755 "$MANAGER_SRC/images/base/environment.sh" "$rootfs/usr/local/bin/environment.sh"
  install -m 0644 "$MANAGER_SRC/images/base/environment.service" "$rootfs/etc/systemd/system/environment.service"
  enable_unit /etc/systemd/system/environment.service sysinit.target
  # images/agent: dnsmasq takes its configuration from the agent only.
  sed -i -e 's/^CONFIG_DIR=\(.*\)$/#CONFIG_DIR=\1/' -e 's/^#IGNORE_RESOLVCONF=\(.*\)$/IGNORE_RESOLVCONF=\1/' \
    "$rootfs/etc/default/dnsmasq"
  # The stand-in for ACME: the certificate the agent's nginx names for the test's domain.
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=$AGENT_DOMAIN" \
    -addext "subjectAltName=DNS:$AGENT_DOMAIN,DNS:*.$AGENT_DOMAIN" \
    -keyout "$rootfs/etc/ssl/private/$AGENT_DOMAIN.key" -out "$rootfs/etc/ssl/certs/$AGENT_DOMAIN.crt" 2>/dev/null
fi

# Kernel modules are the node's business, not a container's (it would fail, and the machine
# would report itself degraded); a console login is no use without one attached.
for unit in systemd-modules-load.service getty@tty1.service console-getty.service; do
  ln -sf /dev/null "$rootfs/etc/systemd/system/$unit"
done
rm -rf "$rootfs/var/cache/apt/archives"/*.deb "$rootfs/var/lib/apt/lists"/* "$rootfs/etc/hostname" "$rootfs/etc/machine-id"
: >"$rootfs/etc/machine-id"

echo "[systemd-image] writing the OCI archive" >&2
tar --numeric-owner --sort=name -C "$rootfs" -cf "$tmp/layer.tar" .
HERE="$HERE" python3 - "$WHICH" "$tmp/layer.tar" "$tmp/out.tar" <<'PY'
import os, sys
sys.path.insert(0, os.environ["HERE"])
from oci import Layout, write_if_changed
which, layer_path, out = sys.argv[1:]
layer = open(layer_path, "rb").read()
layout = Layout()
path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
systemd = {"Entrypoint": ["/sbin/init"], "Env": [path, "container=oci"], "StopSignal": "SIGRTMIN+3"}
if which == "test":
    images = {
        "systemd:1": dict(systemd, ExposedPorts={"22/tcp": {}, "8080/tcp": {}}),
        "sshd:1": {"Entrypoint": ["/usr/local/bin/mw-test-sshd"], "Env": [path], "ExposedPorts": {"22/tcp": {}}},
    }
else:
    images = {"opensource-agent:1": dict(systemd, ExposedPorts={"80/tcp": {}, "443/tcp": {}})}
for name, config in images.items():
    # Also as Manager stores an image it is given (…/library/NAME).
    for prefix in ("mw-test.invalid/", "mw-test.invalid/library/"):
        layout.image(prefix + name, [layer], config)
write_if_changed(out, layout.archive())
PY
mkdir -p "$dir"
mv "$tmp/out.tar" "$archive"
echo "$archive"
