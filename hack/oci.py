"""OCI image archives written without a container engine or a registry.

Shared by hack/images.py (the real node's test images) and hack/image.py (the operator's
image). Everything here is deterministic: tar entries carry mtime 0 and root ownership, JSON
is canonical, gzip carries no name and no time, so the same inputs always give the same bytes
and the same digests.

An archive is an OCI image layout in a tar (what `ctr images import`, `skopeo copy
oci-archive:...` and podman read) plus, for `docker load`, the `manifest.json` of Docker's own
archive format pointing at the same blobs.
"""
import gzip
import hashlib
import io
import json
import os
import tarfile

TAR = "application/vnd.oci.image.layer.v1.tar"
TAR_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tar_bytes(entries):
    """A deterministic tar (mtime 0, root-owned unless told) of entries:
    (path, kind, data_or_target, mode) or (path, kind, data_or_target, mode, uid)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            path, kind, data, mode = entry[:4]
            owner = entry[4] if len(entry) > 4 else 0
            info = tarfile.TarInfo(path)
            info.mtime = 0
            info.uid = info.gid = owner
            info.uname = info.gname = "root" if owner == 0 else ""
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


class Layout:
    """An OCI image layout being assembled in memory: blobs by digest, one manifest per image."""

    def __init__(self):
        self.blobs = {}
        self.manifests = []
        self.docker = []
        self.gzipped = {}  # diff id -> compressed layer: an image under several names is compressed once

    def blob(self, data, media_type):
        digest = sha256(data)
        self.blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    def image(self, name, layers, config, compress=False, annotations=None, architecture="amd64"):
        """Adds image `name` (REPOSITORY:TAG) of `layers` (uncompressed tars, bottom first)
        with `config` (the image config's `config` object), for `architecture` (OCI's name:
        amd64, arm64). Returns the manifest's descriptor."""
        layer_descs, diff_ids = [], []
        for layer in layers:
            diff_ids.append(sha256(layer))
            if compress:
                key = diff_ids[-1]
                if key not in self.gzipped:
                    self.gzipped[key] = gzip.compress(layer, compresslevel=6, mtime=0)
                layer_descs.append(self.blob(self.gzipped[key], TAR_GZIP))
            else:
                layer_descs.append(self.blob(layer, TAR))
        image_config = {
            "architecture": architecture,
            "os": "linux",
            "config": {k: v for k, v in config.items() if v is not None},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
        config_desc = self.blob(canonical(image_config), "application/vnd.oci.image.config.v1+json")
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_desc,
            "layers": layer_descs,
        }
        if annotations:
            manifest["annotations"] = annotations
        desc = self.blob(canonical(manifest), "application/vnd.oci.image.manifest.v1+json")
        desc["platform"] = {"architecture": architecture, "os": "linux"}
        desc["annotations"] = {
            "io.containerd.image.name": name,
            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
        }
        self.manifests.append(desc)
        self.docker.append({
            "Config": "blobs/sha256/" + config_desc["digest"].split(":")[1],
            "RepoTags": [name],
            "Layers": ["blobs/sha256/" + d["digest"].split(":")[1] for d in layer_descs],
        })
        return desc

    def archive(self):
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": self.manifests}
        entries = [
            ("oci-layout", "file", canonical({"imageLayoutVersion": "1.0.0"}), 0o644),
            ("index.json", "file", canonical(index), 0o644),
            ("manifest.json", "file", canonical(self.docker), 0o644),
            ("blobs", "dir", None, 0o755),
            ("blobs/sha256", "dir", None, 0o755),
        ]
        entries += [(f"blobs/sha256/{d.split(':')[1]}", "file", data, 0o644) for d, data in sorted(self.blobs.items())]
        return tar_bytes(entries)


def write_if_changed(path, data):
    """Writes data to path atomically, leaving the file (and its mtime) alone when it already
    holds exactly these bytes."""
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return
    except FileNotFoundError:
        pass
    tmp = f"{path}.partial.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
