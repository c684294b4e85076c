#!/usr/bin/env python3
"""Test images for the real node, built without a registry or a container engine.

Writes one OCI image archive (an OCI image layout in a tar) holding every image the real-node
tests and the demo use, each named mw-test.invalid/NAME:TAG: the `.invalid` top-level domain
is reserved (RFC 2606), so no registry can ever serve these names and a missing image fails
to pull instead of quietly fetching something else. `ctr -n k8s.io images import` reads the
archive; containerd's CRI then finds the images locally (their tags are not `latest`, so the
kubelet's default pull policy is IfNotPresent and never asks a registry).

Every image is one layer of Debian's busybox-static (a shell, httpd, dd, sleep) plus, for
some, a small second layer; what differs is the entrypoint:

  pause:1    the Pod sandbox (containerd's sandbox_image): sleeps forever
  busybox:1  a shell
  httpd:1    busybox httpd on port 8080 answering "mw-test httpd v1", exiting on SIGTERM
  httpd:2    the same answering "mw-test httpd v2" (an image change the tests can see)
  crash:1    prints a line and exits 3
  oom:1      allocates and touches 256 MiB (dd's buffer), past any small memory limit

Each is also named mw-test.invalid/library/NAME:TAG, as Manager stores an image it is given.

Usage: images.py OUT_TAR   (the tar is rewritten only when its content would change)
(hack/oci.py writes the archive.)
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oci import Layout, tar_bytes, write_if_changed  # noqa: E402

BUSYBOX = "/bin/busybox"
REGISTRY = "mw-test.invalid"


def applets():
    out = subprocess.run([BUSYBOX, "--list"], check=True, capture_output=True, text=True).stdout
    return sorted(a for a in out.split() if a and a != "busybox")


def busybox_layer():
    with open(BUSYBOX, "rb") as f:
        binary = f.read()
    entries = [("bin", "dir", None, 0o755), ("bin/busybox", "file", binary, 0o755)]
    entries += [(f"bin/{a}", "symlink", "busybox", 0o777) for a in applets()]
    # What a shell and httpd expect to find; /tmp writable for anything a test runs.
    entries += [
        ("etc", "dir", None, 0o755),
        ("etc/passwd", "file", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n", 0o644),
        ("etc/group", "file", b"root:x:0:\nnogroup:x:65534:\n", 0o644),
        ("tmp", "dir", None, 0o1777),
        ("root", "dir", None, 0o700),
    ]
    return tar_bytes(entries)


def www_layer(text):
    return tar_bytes([("www", "dir", None, 0o755), ("www/index.html", "file", text.encode(), 0o644)])


def image(layout, name, layers, entrypoint, ports=None):
    config = {
        "Entrypoint": entrypoint,
        "Env": ["PATH=/bin"],
        "WorkingDir": "/",
        "ExposedPorts": {f"{p}/tcp": {} for p in (ports or [])} or None,
    }
    layout.image(f"{REGISTRY}/{name}", layers, config)
    # The same image as Manager names it: its normalizeDockerRef puts a one-part path under
    # library/ on any registry (mw-test.invalid/httpd:1 becomes mw-test.invalid/library/httpd:1).
    layout.image(f"{REGISTRY}/library/{name}", layers, config)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    base = busybox_layer()
    layout = Layout()
    image(layout, "pause:1", [base], ["/bin/sleep", "infinity"])
    image(layout, "busybox:1", [base], ["/bin/sh"])
    for version in ("1", "2"):
        image(
            layout,
            f"httpd:{version}",
            [base, www_layer(f"mw-test httpd v{version}\n")],
            # httpd as PID 1 would ignore SIGTERM (PID 1 has no default handlers) and every
            # stop would wait out the 30 s grace period; the shell stops it on SIGTERM.
            ["/bin/sh", "-c", "trap 'kill $pid; exit 0' TERM; httpd -f -v -p 8080 -h /www & pid=$!; wait $pid"],
            ports=[8080],
        )
    image(layout, "crash:1", [base], ["/bin/sh", "-c", "echo 'mw-test crash: exiting with status 3'; exit 3"])
    # dd allocates its block size up front and reads /dev/zero into it, touching every page.
    image(layout, "oom:1", [base], ["/bin/dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"])
    write_if_changed(sys.argv[1], layout.archive())


if __name__ == "__main__":
    main()
