# The operator's image with a container engine, for those who have one:
#   docker build -t <registry>/mw-operator:0.1.0 . && docker push <registry>/mw-operator:0.1.0
# `make image` builds an image of the same files without one (docs/install.md, "The image";
# not the same digest: the layers and labels differ): both put exactly the files
# hack/image.py lists on an empty base (the release binary, the libraries the
# loader opens for it, Debian's CA bundle, root and nonroot users, the licences) and run it
# as 65532. CI builds `make image`'s recipe; no container engine runs there.
FROM rust:1.95-bookworm AS build
WORKDIR /src
RUN command -v python3 >/dev/null || { apt-get update && apt-get install -y --no-install-recommends python3; }
COPY Cargo.toml Cargo.lock ./
# The allocator's build option (src/allocator.rs).
COPY .cargo .cargo
COPY src src
# `mw-operator check` embeds the shipped Roles, so it can never disagree with them.
COPY config/rbac config/rbac
RUN cargo build --release --locked --bin mw-operator
COPY LICENSE ./
COPY hack/image.py hack/oci.py hack/
RUN python3 hack/image.py --binary target/release/mw-operator --licence LICENSE --rootfs /rootfs

FROM scratch
COPY --from=build /rootfs /
USER 65532:65532
ENV PATH=/usr/local/bin:/usr/bin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
LABEL org.opencontainers.image.title=mw-operator \
      org.opencontainers.image.source=https://github.com/mieweb/opensource-server \
      org.opencontainers.image.licenses=MIT
ENTRYPOINT ["/usr/local/bin/mw-operator"]
CMD ["run"]
