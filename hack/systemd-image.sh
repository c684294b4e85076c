#!/usr/bin/env bash
# The system-container test image for the real node: Debian 13 with systemd as process 1 and
# sshd, as Manager's own templates are (images/base in Manager's repository: Debian 13, ENTRYPOINT
# /sbin/init, STOPSIGNAL SIGRTMIN+3), built without a registry or a container engine:
# debootstrap (minbase) from Debian's mirror, then one layer in an OCI archive (hack/oci.py).
# Named mw-test.invalid/systemd:1 (no registry can serve it, as the other test images).
#
# For the tests to look inside without exec, a unit serves busybox httpd on port 8080 with two
# CGI scripts: /cgi-bin/state (systemd's state, sshd's, the hostname, /data/mark) and
# /cgi-bin/mark (writes its query string to /data/mark, the workload's volume).
#
#   hack/systemd-image.sh      print the archive's path, building it once (about a minute)
#
# Cached under ~/.cache/mw-operator/systemd-image/<key>, the key a digest of this script and
# hack/oci.py: a change of either builds a new one. Needs root (debootstrap).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE_ROOT=${MW_CACHE_DIR:-$HOME/.cache/mw-operator}
SUITE=trixie
MIRROR=${MW_DEBIAN_MIRROR:-http://deb.debian.org/debian}

key=$(cat "$0" "$HERE/oci.py" | sha256sum | cut -c1-12)
dir="$CACHE_ROOT/systemd-image/$key"
archive="$dir/mw-test-systemd.tar"
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
echo "[systemd-image] debootstrap $SUITE (minbase, systemd, dbus, openssh-server) into $rootfs" >&2
debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,openssh-server \
  "$SUITE" "$rootfs" "$MIRROR" >"$tmp/debootstrap.log" 2>&1 ||
  { tail -20 "$tmp/debootstrap.log" >&2; exit 1; }

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
ln -sf /etc/systemd/system/mw-test-httpd.service "$rootfs/etc/systemd/system/default.target.wants/mw-test-httpd.service" 2>/dev/null ||
  { mkdir -p "$rootfs/etc/systemd/system/default.target.wants" &&
    ln -sf /etc/systemd/system/mw-test-httpd.service "$rootfs/etc/systemd/system/default.target.wants/"; }
# Kernel modules are the node's business, not a container's (it would fail, and the machine
# would report itself degraded); a console login is no use without one attached.
for unit in systemd-modules-load.service getty@tty1.service console-getty.service; do
  ln -sf /dev/null "$rootfs/etc/systemd/system/$unit"
done
rm -rf "$rootfs/var/cache/apt/archives"/*.deb "$rootfs/var/lib/apt/lists"/* "$rootfs/etc/hostname" "$rootfs/etc/machine-id"
: >"$rootfs/etc/machine-id"

echo "[systemd-image] writing the OCI archive" >&2
tar --numeric-owner --sort=name -C "$rootfs" -cf "$tmp/layer.tar" .
HERE="$HERE" python3 - "$tmp/layer.tar" "$tmp/mw-test-systemd.tar" <<'PY'
import os, sys
sys.path.insert(0, os.environ["HERE"])
from oci import Layout, write_if_changed
layer = open(sys.argv[1], "rb").read()
layout = Layout()
config = {
    "Entrypoint": ["/sbin/init"],
    "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "container=oci"],
    "StopSignal": "SIGRTMIN+3",
    "ExposedPorts": {"22/tcp": {}, "8080/tcp": {}},
}
for name in ("mw-test.invalid/systemd:1", "mw-test.invalid/library/systemd:1"):
    layout.image(name, [layer], config)
write_if_changed(sys.argv[2], layout.archive())
PY
mkdir -p "$dir"
mv "$tmp/mw-test-systemd.tar" "$archive"
echo "$archive"
