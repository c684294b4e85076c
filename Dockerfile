# The operator's image: a static-enough release build on a distroless, non-root base.
#   docker build -t <registry>/mw-operator:0.1.0 . && docker push <registry>/mw-operator:0.1.0
# (Not built in CI: the CI machines have no container engine.)
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
# `mw-operator check` embeds the shipped Roles, so it can never disagree with them.
COPY config/rbac config/rbac
RUN cargo build --release --locked --bin mw-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/mw-operator /usr/local/bin/mw-operator
# The licence travels with the binary it covers.
COPY LICENSE /usr/share/doc/mw-operator/LICENSE
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/mw-operator"]
CMD ["run"]
