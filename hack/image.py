#!/usr/bin/env python3
"""The operator's OCI image (the bridge is the same binary), built without a container engine.

    image.py --binary target/release/mw-operator --name mw-operator:0.1.0 --out IMAGE.tar
    image.py --binary target/release/mw-operator --rootfs DIR     (the same files into DIR)

What the image holds, and nothing else:
  /usr/local/bin/mw-operator          the binary
  the shared libraries it loads       found with ldd (glibc, libgcc_s, libm, the loader), each
                                      at the path the loader looks for it, from this machine
  /etc/ssl/certs/ca-certificates.crt  Debian's CA bundle (TLS to a database or API server with
                                      a public certificate; in-cluster the service account's CA)
  /etc/passwd, /etc/group             root and nonroot (65532), as distroless images have them
  /tmp                                (read-only root filesystems mount nothing here; kept for
                                      anyone running it without one)
  /usr/share/doc/...                  the licences of everything above

The image is for the binary's architecture, read from its ELF header: x86_64 (OCI's amd64) or
aarch64 (arm64), and it must be this machine's, whose libraries go in; any other is refused.

It runs as 65532:65532 (non-root) with ENTRYPOINT mw-operator, CMD run. Layers are gzip'd
deterministic tars (mtime 0, sorted), so the same binary and the same Debian packages give the
same digest, build after build: the digest is printed. The archive is an OCI image layout in a
tar with Docker's manifest.json beside it: `ctr images import`, `skopeo copy oci-archive:...`,
`podman load` and `docker load` all read it (docs/install.md, "The image").

`--rootfs` writes the same file tree into a directory instead: the Dockerfile's last stage is
`FROM scratch` + that directory, so the two ways of building stay equivalent.
"""
import argparse
import os
import platform
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oci import Layout, tar_bytes, write_if_changed  # noqa: E402

NONROOT = 65532
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
BINARY_PATH = "usr/local/bin/mw-operator"

# The ELF header's e_machine (the ELF specification's numbers) of each architecture the image
# can be built for: its machine name, as Rust's target triples and `uname -m` spell it, and
# OCI's (the Go names the image config and the index's platform use).
ARCHITECTURES = {62: ("x86_64", "amd64"), 183: ("aarch64", "arm64")}
SUPPORTED = ", ".join(f"{machine} ({oci})" for machine, oci in ARCHITECTURES.values())


def architecture(binary):
    """OCI's name for the architecture `binary` is built for. Refused: anything but the
    architectures above, and a binary of another architecture than this machine's, whose
    shared libraries would go in beside it (ldd cannot read a foreign binary either)."""
    with open(binary, "rb") as f:
        header = f.read(20)
    if len(header) < 20 or header[:4] != b"\x7fELF":
        sys.exit(f"image.py: {binary} is not an ELF executable")
    order = "little" if header[5] == 1 else "big"
    e_machine = int.from_bytes(header[18:20], order)
    if e_machine not in ARCHITECTURES:
        sys.exit(f"image.py: {binary} is built for ELF machine {e_machine}; the image can be built for {SUPPORTED} only")
    machine, oci = ARCHITECTURES[e_machine]
    if platform.machine() != machine:
        sys.exit(f"image.py: {binary} is built for {machine}, but this machine is {platform.machine()}: the image takes "
                 f"the binary's shared libraries from this machine, so build it on {machine} (supported: {SUPPORTED})")
    return oci


def shared_libraries(binary):
    """The absolute paths the dynamic loader opens for `binary`: each library as ldd names it,
    and the loader itself (the ELF interpreter)."""
    out = subprocess.run(["ldd", binary], check=True, capture_output=True, text=True).stdout
    if "not a dynamic executable" in out or "statically linked" in out:
        return []
    paths = []
    for line in out.splitlines():
        line = line.strip()
        m = re.match(r"\S+ => (/\S+) \(0x[0-9a-f]+\)$", line) or re.match(r"(/\S+) \(0x[0-9a-f]+\)$", line)
        if m:
            paths.append(m.group(1))
        elif "=> not found" in line:
            sys.exit(f"image.py: {binary} needs {line.split()[0]}, which this machine lacks")
    return sorted(set(paths))


def package_of(path):
    """The Debian package that installed `path` (for its copyright file), or None."""
    for candidate in (path, os.path.realpath(path)):
        r = subprocess.run(["dpkg-query", "-S", candidate], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":", 1)[0].split(",")[0].strip()
    return None


def normalized(name):
    """NAME as containerd's CRI looks it up: `mw-operator:0.1.0` is docker.io/library/mw-operator:0.1.0
    (what `docker load` and the kubelet make of a name without a registry)."""
    first, _, rest = name.partition("/")
    if not rest:
        return f"docker.io/library/{name}"
    if "." in first or ":" in first or first == "localhost":
        return name
    return f"docker.io/{name}"


def read(path):
    with open(path, "rb") as f:
        return f.read()


def parents(path):
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def entries_with_dirs(files):
    """Tar entries for `files` ({path: (kind, data, mode, owner)}) with every parent directory,
    sorted so the tar is the same however the dict was filled."""
    dirs = {d for path in files for d in parents(path)}
    entries = [(d, "dir", None, 0o755, 0) for d in dirs if d not in files]
    entries += [(p, kind, data, mode, owner) for p, (kind, data, mode, owner) in files.items()]
    return sorted(entries, key=lambda e: e[0])


def base_files(binary):
    """What the binary needs at run time: its libraries, CA certificates, users, licences."""
    files = {}
    packages = set()
    for lib in shared_libraries(binary):
        files[lib.lstrip("/")] = ("file", read(os.path.realpath(lib)), 0o755, 0)
        packages.add(package_of(lib))
    if not os.path.exists(CA_BUNDLE):
        sys.exit(f"image.py: {CA_BUNDLE} is missing (Debian's ca-certificates package)")
    files[CA_BUNDLE.lstrip("/")] = ("file", read(CA_BUNDLE), 0o644, 0)
    packages.add("ca-certificates")
    files["etc/passwd"] = ("file", f"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/sbin/nologin\n".encode(), 0o644, 0)
    files["etc/group"] = ("file", f"root:x:0:\nnonroot:x:{NONROOT}:\n".encode(), 0o644, 0)
    files["home/nonroot"] = ("dir", None, 0o700, NONROOT)
    files["tmp"] = ("dir", None, 0o1777, 0)
    for package in sorted(p for p in packages if p):
        copyright_file = f"/usr/share/doc/{package}/copyright"
        if os.path.exists(copyright_file):
            files[copyright_file.lstrip("/")] = ("file", read(copyright_file), 0o644, 0)
    return files


def app_files(binary, licence):
    return {
        BINARY_PATH: ("file", read(binary), 0o755, 0),
        "usr/share/doc/mw-operator/LICENSE": ("file", read(licence), 0o644, 0),
    }


def write_rootfs(directory, layers):
    for files in layers:
        for path, kind, data, mode, owner in entries_with_dirs(files):
            target = os.path.join(directory, path)
            if kind == "dir":
                os.makedirs(target, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "wb") as f:
                    f.write(data)
            os.chmod(target, mode)
            os.chown(target, owner, owner)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", required=True, help="the mw-operator binary (a release build)")
    parser.add_argument("--licence", default=os.path.join(os.path.dirname(__file__), "..", "LICENSE"))
    parser.add_argument("--name", action="append", default=[],
                        help="REPOSITORY:TAG the archive names the image, e.g. mw-operator:0.1.0 (repeatable: one image, several names)")
    parser.add_argument("--version", help="org.opencontainers.image.version (default: the tag)")
    parser.add_argument("--revision", help="org.opencontainers.image.revision (a git commit)")
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("--out", help="the OCI archive to write")
    out.add_argument("--rootfs", help="write the image's files into this directory instead")
    args = parser.parse_args()

    arch = architecture(args.binary)
    layers = [base_files(args.binary), app_files(args.binary, args.licence)]
    if args.rootfs:
        write_rootfs(args.rootfs, layers)
        return
    if not args.name or any(":" not in n.rsplit("/", 1)[-1] for n in args.name):
        sys.exit("image.py: --name REPOSITORY:TAG is required with --out")
    labels = {
        "org.opencontainers.image.title": "mw-operator",
        "org.opencontainers.image.description": "Runs Manager (mieweb/opensource-server) containers on Kubernetes as ManagedWorkload resources",
        "org.opencontainers.image.source": "https://github.com/mieweb/opensource-server",
        "org.opencontainers.image.licenses": "MIT",
        "org.opencontainers.image.version": args.version or args.name[0].rsplit(":", 1)[1],
    }
    if args.revision:
        labels["org.opencontainers.image.revision"] = args.revision
    layers = [tar_bytes(entries_with_dirs(files)) for files in layers]
    config = {
        "User": f"{NONROOT}:{NONROOT}",
        "Entrypoint": ["/" + BINARY_PATH],
        "Cmd": ["run"],
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", f"SSL_CERT_FILE={CA_BUNDLE}"],
        "WorkingDir": "/",
        "Labels": labels,
    }
    layout = Layout()
    for name in args.name:
        desc = layout.image(normalized(name), layers, config, compress=True, annotations=labels, architecture=arch)
    write_if_changed(args.out, layout.archive())
    print(f"{args.out}: {' '.join(args.name)} linux/{arch} {desc['digest']}")


if __name__ == "__main__":
    main()
