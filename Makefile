# The two commands a newcomer needs:
#   make demo   local control plane + operator + a sample ManagedWorkload reaching Running
#   make test   formatting, lints, unit tests and integration tests on a local control plane
.PHONY: demo demo-down test test-compat unit bench soak crds manifests cluster-up cluster-down cluster-status build image tools

CP := hack/controlplane.sh

demo:
	bash hack/demo.sh

demo-down:
	bash hack/demo.sh down

test:
	bash hack/test.sh

# The CRD, the samples and the lifecycle suite on the oldest supported Kubernetes (v1.31);
# not part of `make test` (docs/testing.md says why).
test-compat:
	bash hack/test-compat.sh

# Scale figures: API writes per workload, writes while idle and after a restart, memory.
bench:
	bash hack/bench.sh

# Half an hour of changes, API server restarts and a leader's death at N = 5000: every change
# carried out, writes per change, memory over time, writes at rest (docs/performance.md).
soak:
	bash hack/soak.sh

# Unit tests only: no control plane needed.
unit:
	cargo test --lib --bins

build:
	cargo build --locked --release

# The operator's OCI image (the bridge is the same binary), built without a container engine
# for this machine's architecture (amd64 or arm64; hack/image.py refuses others):
# target/image/mw-operator.oci.tar, named $(IMAGE). Push it with skopeo, crane, ctr or
# `docker load` (docs/install.md, "The image").
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
IMAGE ?= mw-operator:$(VERSION)
image: build
	@mkdir -p target/image
	python3 hack/image.py --binary target/release/mw-operator --name $(IMAGE) \
	  --revision "$$(git rev-parse HEAD 2>/dev/null)" --out target/image/mw-operator.oci.tar

# Regenerate crds/ from src/resource.rs (make test fails when it is stale).
crds:
	cargo run --quiet -- crd --out crds
	cargo run --quiet -- crd --out charts/mw-operator/crds

# Regenerate config/install/ from the Helm chart (make test fails when it is stale).
manifests:
	bash hack/manifests.sh

tools:
	bash hack/ensure-tools.sh

cluster-up:
	bash $(CP) up

cluster-down:
	bash $(CP) down

cluster-status:
	bash $(CP) status
