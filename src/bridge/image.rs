//! Is a `Containers.template` a container image reference? Manager stores Docker images
//! normalised to `host/org/image:tag` and legacy Proxmox templates (`local:vztmpl/…`,
//! `debian-12-standard`) in the same column; only the first can run on Kubernetes.
//!
//! The grammar is the distribution reference grammar (the one `docker pull` and the kubelet
//! accept), plus Manager's own rule that an image reference contains a `/`.

/// Why a template is not an image reference, for the row error.
pub fn check(reference: &str) -> Result<(), &'static str> {
    if reference.is_empty() {
        return Err("it is empty");
    }
    if reference.len() > 1024 || reference.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("it contains whitespace or control characters");
    }
    if !reference.contains('/') {
        return Err("it has no '/': Manager keeps images as host/org/image:tag, so this is a Proxmox template");
    }
    let (name_and_tag, digest) = match reference.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (reference, None),
    };
    if let Some(digest) = digest {
        check_digest(digest)?;
    }
    // A tag follows the last ':' only when no '/' comes after it (otherwise it was a port).
    let (name, tag) = match name_and_tag.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, Some(t)),
        _ => (name_and_tag, None),
    };
    if let Some(tag) = tag {
        check_tag(tag)?;
    }
    if name.len() > 255 {
        return Err("its name is longer than 255 characters");
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    let first = parts[0];
    if parts.len() > 1 && (first.contains('.') || first.contains(':') || first == "localhost") {
        check_domain(first)?;
        parts.remove(0);
    }
    parts.iter().try_for_each(|p| check_path_component(p))
}

fn check_domain(domain: &str) -> Result<(), &'static str> {
    let (host, port) = match domain.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (domain, None),
    };
    if let Some(port) = port
        && (port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("its registry port is not a number");
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host.split('.').all(label_ok) { Ok(()) } else { Err("its registry host is not a valid host name") }
}

/// `[a-z0-9]+` joined by `.`, `_`, `__` or runs of `-`.
fn check_path_component(component: &str) -> Result<(), &'static str> {
    const BAD: &str = "a path component is not lowercase letters and digits joined by '.', '_' or '-'";
    let bytes = component.as_bytes();
    if bytes.is_empty() || !bytes[0].is_ascii_alphanumeric() || !bytes[bytes.len() - 1].is_ascii_alphanumeric() {
        return Err(BAD);
    }
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b.is_ascii_lowercase() || b.is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !(bytes[i].is_ascii_lowercase() || bytes[i].is_ascii_digit()) {
            i += 1;
        }
        let sep = &component[start..i];
        let dashes = sep.bytes().all(|b| b == b'-');
        if !(sep == "." || sep == "_" || sep == "__" || dashes) {
            return Err(BAD);
        }
    }
    Ok(())
}

fn check_tag(tag: &str) -> Result<(), &'static str> {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = tag.as_bytes();
    if bytes.is_empty()
        || bytes.len() > 128
        || !word(bytes[0])
        || !bytes.iter().all(|&b| word(b) || b == b'.' || b == b'-')
    {
        return Err("its tag is not 1-128 letters, digits, '_', '.' or '-'");
    }
    Ok(())
}

fn check_digest(digest: &str) -> Result<(), &'static str> {
    const BAD: &str = "its digest is not algorithm:hex";
    let (algorithm, hex) = digest.split_once(':').ok_or(BAD)?;
    let algorithm_ok = !algorithm.is_empty()
        && algorithm.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'+' | b'.'));
    if !algorithm_ok || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(BAD);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn images_manager_stores_are_accepted() {
        for ok in [
            "docker.io/library/nginx:1.27",
            "docker.io/library/postgres:16",
            "ghcr.io/mieweb/opensource-server/base:latest",
            "registry.example.com:5000/team/app",
            "localhost/app:dev",
            "library/nginx",
            "quay.io/org/img_name__x.y-z:v1.2.3-rc_1",
            "ghcr.io/org/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "ghcr.io/org/app:1.0@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn templates_that_are_not_images_are_refused() {
        for bad in [
            "",
            "nginx",
            "debian-12-standard_12.7-1_amd64.tar.zst",
            "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst",
            "docker.io/library/NGINX:latest",
            "docker.io/library/nginx:",
            "docker.io/library/nginx latest",
            "docker.io//nginx",
            "docker.io/library/nginx@sha256:short",
            "-bad.example/app",
        ] {
            assert!(check(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
