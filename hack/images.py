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

Usage: images.py OUT_TAR   (the tar is rewritten only when its content would change)
"""
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

BUSYBOX = "/bin/busybox"
REGISTRY = "mw-test.invalid"


def applets():
    out = subprocess.run([BUSYBOX, "--list"], check=True, capture_output=True, text=True).stdout
    return sorted(a for a in out.split() if a and a != "busybox")


def tar_bytes(entries):
    """A deterministic tar (mtime 0, root-owned) of entries: (path, kind, data_or_target, mode)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, kind, data, mode in entries:
            info = tarfile.TarInfo(path)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = mode
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


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


class Layout:
    def __init__(self):
        self.blobs = {}
        self.manifests = []

    def blob(self, data, media_type):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    def image(self, name, layers, entrypoint, cmd=None, ports=None):
        layer_descs = [self.blob(layer, "application/vnd.oci.image.layer.v1.tar") for layer in layers]
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": entrypoint,
                "Cmd": cmd,
                "Env": ["PATH=/bin"],
                "WorkingDir": "/",
                "ExposedPorts": {f"{p}/tcp": {} for p in (ports or [])} or None,
            },
            "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in layer_descs]},
        }
        config["config"] = {k: v for k, v in config["config"].items() if v is not None}
        config_desc = self.blob(canonical(config), "application/vnd.oci.image.config.v1+json")
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_desc,
            "layers": layer_descs,
        }
        desc = self.blob(canonical(manifest), "application/vnd.oci.image.manifest.v1+json")
        desc["platform"] = {"architecture": "amd64", "os": "linux"}
        desc["annotations"] = {
            "io.containerd.image.name": f"{REGISTRY}/{name}",
            "org.opencontainers.image.ref.name": name.split(":", 1)[1],
        }
        self.manifests.append(desc)

    def archive(self):
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": self.manifests}
        entries = [
            ("oci-layout", "file", canonical({"imageLayoutVersion": "1.0.0"}), 0o644),
            ("index.json", "file", canonical(index), 0o644),
            ("blobs", "dir", None, 0o755),
            ("blobs/sha256", "dir", None, 0o755),
        ]
        entries += [(f"blobs/sha256/{d.split(':')[1]}", "file", data, 0o644) for d, data in sorted(self.blobs.items())]
        return tar_bytes(entries)


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    base = busybox_layer()
    layout = Layout()
    layout.image("pause:1", [base], ["/bin/sleep", "infinity"])
    layout.image("busybox:1", [base], ["/bin/sh"])
    for version in ("1", "2"):
        layout.image(
            f"httpd:{version}",
            [base, www_layer(f"mw-test httpd v{version}\n")],
            # httpd as PID 1 would ignore SIGTERM (PID 1 has no default handlers) and every
            # stop would wait out the 30 s grace period; the shell stops it on SIGTERM.
            ["/bin/sh", "-c", "trap 'kill $pid; exit 0' TERM; httpd -f -v -p 8080 -h /www & pid=$!; wait $pid"],
            ports=[8080],
        )
    layout.image("crash:1", [base], ["/bin/sh", "-c", "echo 'mw-test crash: exiting with status 3'; exit 3"])
    # dd allocates its block size up front and reads /dev/zero into it, touching every page.
    layout.image("oom:1", [base], ["/bin/dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"])
    data = layout.archive()
    try:
        with open(out, "rb") as f:
            if f.read() == data:
                return
    except FileNotFoundError:
        pass
    tmp = f"{out}.partial.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
