SHELL := /bin/bash
# vpcni — see README.md. Everything runs as root on a Linux node; `make test`
# installs what it needs itself.
GO        ?= /usr/local/go/bin/go
export PATH := /usr/local/go/bin:$(PATH)
BIN       := bin
# The version: git describe's (v0.3.0 on a release tag, v0.3.0-4-gabc1234
# after it, a bare commit where no tag is behind it; -dirty with local
# changes). Every binary prints it (-version; `vpcnictl version`), the image
# is tagged with it and carries it in its labels.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
# Static binaries: no dynamic loader on the plugin's critical path, and they
# run in any container image.
GOBUILD   := CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)"
PKG_TEST_TIMEOUT ?= 15m

.PHONY: release registry release-e2e conformance conformance-subset dualstack conformance-build conformance-build-bg release-build-bg e2e-lab-ebpf all build image prev-image upgrade-e2e k8s-build k8s-fixture deps generate verify-generate helm test unit fuzz fuzz-long k8s-api integration e2e-neutron-agents e2e-nova e2e-k8s e2e-k8s-twonode bench-startup e2e-k8s-helm critest chaos lint demo bench bench-scale clean

all: build

build:
	$(GOBUILD) -o $(BIN)/ ./cmd/vpcni ./cmd/vpcnid ./cmd/vpcnictl ./cmd/vpcni-controller ./cmd/kubectl-vpcni

# The node image for a real Kubernetes node: the node's binaries
# (IMAGE_CMDS), static, in /usr/local/bin; the upstream portmap and bandwidth plugins the conflist
# chains (scripts/cni-plugins.sh) in /opt/cni-plugins; nft and its libraries
# (scripts/image-nft.sh: the SNAT table is written by knftables, which runs
# nft); a docker-save tarball for `ctr -n k8s.io images import`, of this
# machine's architecture, tagged with the version (make release writes the
# OCI image archives for every architecture). Its name is in
# $(BIN)/vpcni-image.name. kubectl-vpcni is not among them: it is for an
# operator's workstation (the release's CLI tarball).
IMAGE_CMDS := ./cmd/vpcni ./cmd/vpcnid ./cmd/vpcnictl ./cmd/vpcni-controller
IMAGE     ?= vpcni/vpcni:$(VERSION)
# The CA bundle the image trusts for HTTPS clouds (Keystone, Neutron).
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
# The same image as an OCI image archive ($(BIN)/vpcni-image.oci.tar,
# labelled as a release's): what the real-node e2e pushes to its registry.
IMAGE_LABELS = -created $$(git log -1 --format=%ct 2>/dev/null || echo 0) -label org.opencontainers.image.version=$(VERSION) \
	-label org.opencontainers.image.revision=$$(git rev-parse HEAD 2>/dev/null) -label org.opencontainers.image.licenses=Apache-2.0
image:
	rm -rf $(BIN)/image && mkdir -p $(BIN)/image
	$(GOBUILD) -o $(BIN)/image/ $(IMAGE_CMDS)
	bash scripts/cni-plugins.sh $(BIN)/cni-plugins
	nft=$$(bash scripts/image-nft.sh) && \
	$(GO) run ./tools/mkimage -name $(IMAGE) -out $(BIN)/vpcni-image.tar -tree $(BIN)/image:/usr/local/bin -dir /tmp:1777 -entrypoint /usr/local/bin/vpcnid \
		-env PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		-tree $(BIN)/cni-plugins:/opt/cni-plugins $$nft \
		$$([ -f $(CA_BUNDLE) ] && echo -file $(CA_BUNDLE):/etc/ssl/certs/ca-certificates.crt:0644)
	$(GO) run ./tools/ocilayout -ref docker.io/$(IMAGE) -out $(BIN)/vpcni-image.oci.tar $(IMAGE_LABELS) $(BIN)/vpcni-image.tar
	echo $(IMAGE) > $(BIN)/vpcni-image.name

# The release, for amd64 and arm64 (RELEASE_ARCHES), in $(BIN)/release:
# the node image as OCI image archives (every architecture in one, and one
# per architecture), the CNI plugin and vpcnictl per architecture, the Helm
# chart package and SHA256SUMS; one line printed per artifact with its
# architecture and size (scripts/release.sh, docs/releasing.md). make test
# runs it in release-e2e, last. Cold, the arm64 half compiles every
# dependency for arm64 (7.3 min of CPU for the whole release here, most of
# it arm64), builds the chained plugins (~35 s of CPU) and fetches
# Debian's arm64 nft packages (~3 MB, ~20 s); warm, make release is
# ~50 s of CPU (linking, compressing).
RELEASE_ARCHES ?= amd64 arm64
release:
	@VERSION=$(VERSION) OUT=$(BIN)/release ARCHES='$(RELEASE_ARCHES)' GO=$(GO) CA_BUNDLE=$(CA_BUNDLE) bash scripts/release.sh

# The local registry (distribution's, on 127.0.0.1:5100) and crane, built
# from their Go modules and cached in /var/cache/vpcni-registry
# (scripts/registry.sh; make deps starts the cold build). test/release
# pushes make release's multi-architecture image to it with crane and with
# skopeo, shows the index lists linux/amd64 and linux/arm64 and has the
# archive's digest (release-registry: lines),
# checks each architecture's binaries are built for it, and has a real
# containerd pull the amd64 image by digest, run its agent and import the
# archive (~20 s past make release).
registry:
	bash scripts/registry.sh build >/dev/null

release-e2e: release registry
	VPCNI_REQUIRE_ROOT=1 VPCNI_RELEASE_DIR=$(CURDIR)/$(BIN)/release $(GO) test -count=1 -timeout 10m -v ./test/release 2>&1 | tee /tmp/vpcni-release-e2e.log | scripts/testfilter '^release' ; exit $${PIPESTATUS[0]}

# Kubernetes for the end-to-end tests on a real node (cached in /var/cache/vpcni-k8s),
# and the fixture's own test with Debian's bridge plugin (docs/k8s-node.md).
# The release `make upgrade-e2e` installs first and upgrades from (and
# later rolls back to): the previous release's source (from git) built
# into its own image, $(BIN)/prev/vpcni-image.tar, with its deploy/ beside
# it, cached while UPGRADE_FROM stays. When cutting a release, set it to
# the release before. Tagged with its version (UPGRADE_FROM), and also
# written as an OCI image archive ($(BIN)/prev/vpcni-image.oci.tar, by
# this tree's tools/ocilayout) for the e2e's registry.
UPGRADE_FROM ?= dc642a0
PREV_IMAGE   := vpcni/vpcni:$(UPGRADE_FROM)
prev-image:
	@if [ "$$(cat $(BIN)/prev/vpcni-image.name 2>/dev/null)" = "$(PREV_IMAGE)" ] && [ -f $(BIN)/prev/vpcni-image.tar ] && [ -f $(BIN)/prev/vpcni-image.oci.tar ] && [ -d $(BIN)/prev/deploy ]; then \
		echo "previous release image $(PREV_IMAGE): cached"; \
	else \
		rm -rf $(BIN)/prev && mkdir -p $(BIN)/prev/src && \
		git archive $(UPGRADE_FROM) | tar -x -C $(BIN)/prev/src && \
		$(MAKE) -C $(BIN)/prev/src image BIN=$(CURDIR)/$(BIN)/prev IMAGE=$(PREV_IMAGE) VERSION=$(UPGRADE_FROM) && \
		cp -r $(BIN)/prev/src/deploy $(BIN)/prev/deploy && \
		rm -rf $(BIN)/prev/src $(BIN)/prev/image && \
		$(GO) run ./tools/ocilayout -ref docker.io/$(PREV_IMAGE) -out $(BIN)/prev/vpcni-image.oci.tar -label org.opencontainers.image.version=$(UPGRADE_FROM) $(BIN)/prev/vpcni-image.tar; \
	fi

k8s-build:
	bash scripts/k8s-node.sh build

k8s-fixture: k8s-build image
	VPCNI_REQUIRE_ROOT=1 $(GO) test -count=1 -timeout 10m -v ./test/k8s 2>&1 | $(TESTFILTER) ; exit $${PIPESTATUS[0]}

deps:
	bash scripts/install-deps.sh
	@# helm's cold build (~2.5 min) starts now, in the background: its module
	@# downloads overlap lint, vet and the Kubernetes build; make helm waits.
	@[ -x "$${VPCNI_HELM_CACHE:-/var/cache/vpcni-helm}/v3.21.4/helm" ] || { nohup bash scripts/helm.sh >/tmp/vpcni-helm-build.log 2>&1 & }
	@# The registry and crane likewise (3-6 min cold); make registry waits.
	@nohup bash scripts/registry.sh build >/tmp/vpcni-registry-build.log 2>&1 &

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet ./...

# The PodAddress API's deep copies and its CRD (deploy/vpcni.io_podaddresses.yaml)
# are generated from the Go types in internal/apis by controller-gen, pinned in
# the //go:generate line there and fetched through the Go module proxy. Mode
# ebpf's tc object (internal/datapath/ebpf/bpf/fastpath.o) is compiled from
# fastpath.c by Debian's clang (bpf/build.sh), reproducibly.
generate:
	$(GO) generate ./internal/apis/... ./internal/datapath/ebpf/...

# Fails when a generated file differs from what the generator writes now. It
# generates into a copy of the module, so the work tree is left as it is.
verify-generate:
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	cp -r go.mod go.sum internal deploy "$$tmp"/; \
	(cd "$$tmp" && $(GO) generate ./internal/apis/...) || { echo "verify-generate: the generator did not run (it needs the Go module proxy once)"; exit 1; }; \
	(cd "$$tmp" && $(GO) generate ./internal/datapath/ebpf/...) || { echo "verify-generate: clang could not build the ebpf object (make deps installs clang, llvm, libbpf-dev)"; exit 1; }; \
	{ diff -ru internal/apis "$$tmp"/internal/apis && diff -ru deploy "$$tmp"/deploy && cmp internal/datapath/ebpf/bpf/fastpath.o "$$tmp"/internal/datapath/ebpf/bpf/fastpath.o; } || \
	{ echo "verify-generate: generated files are stale: run make generate and commit the result"; exit 1; }

# The Helm chart (deploy/helm/vpcni) against deploy/: helm template with the
# defaults must give the objects kubectl kustomize deploy/ gives, and each
# value must land where vpcni reads it (test/helm, ~1 s). helm is built from
# its Go module by scripts/helm.sh (cached in /var/cache/vpcni-helm, ~2.5 min
# cold); kubectl comes from the Kubernetes build.
helm: k8s-build
	bash scripts/helm.sh >/dev/null
	$$(bash scripts/helm.sh) lint --strict deploy/helm/vpcni 2>&1 | grep -v 'found symbolic link' ; exit $${PIPESTATUS[0]}
	$(GO) test -count=1 -v ./test/helm 2>&1 | $(TESTFILTER) ; exit $${PIPESTATUS[0]}

unit:
	$(GO) test -count=1 $$($(GO) list ./... | grep -v /test/)

# Every fuzz target, as Target:package; one line adds one. make fuzz runs
# each for FUZZTIME (10 s; make test runs it), make fuzz-long for 10
# minutes each. Seed corpora live in testdata/fuzz, or are made by the
# target (FuzzOpen's store files).
FUZZ_TARGETS := \
	FuzzDecodeRequest:./internal/agent \
	FuzzParseConfig:./internal/cniplugin \
	FuzzOpen:./internal/store \
	FuzzManagerOps:./internal/addresses \
	FuzzSplitMarks:./internal/provider/openstack \
	FuzzNeutronResponses:./internal/provider/openstack
FUZZTIME ?= 10s
# Minimizing a new input stops the fuzzing meanwhile, for up to 60 s by
# default; a whole store file (32 KiB) or Neutron answer (kilobytes)
# barely shrinks, so minimizing it would take most of a short run.
FUZZMINIMIZETIME ?= 1s
# Temporary files in memory: FuzzOpen's store commits each fsync, which on
# a disk set the pace (~130 inputs/s here, ~1,200/s on tmpfs).
FUZZTMP ?= $(shell [ -d /dev/shm ] && echo /dev/shm || echo /tmp)
# A run that fails with Go's own "context deadline exceeded" and writes no
# failing input is the fuzzing coordinator racing its -fuzztime deadline
# (golang/go#75804, fixed in Go 1.27), not a finding: it is run once more,
# and says so. Any other failure, or a second one, fails.
fuzz:
	@set -eo pipefail; for t in $(FUZZ_TARGETS); do \
		f=$${t%%:*}; p=$${t#*:}; try=1; \
		while :; do \
			echo "fuzz: $$f in $$p for $(FUZZTIME)"; \
			rc=0; TMPDIR=$(FUZZTMP) $(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=$(FUZZMINIMIZETIME) "$$p" 2>&1 | tee /tmp/vpcni-fuzz-$$f.log || rc=$$?; \
			[ $$rc = 0 ] && break; \
			if [ $$try = 1 ] && grep -qx '    context deadline exceeded' /tmp/vpcni-fuzz-$$f.log && ! grep -q 'Failing input written to' /tmp/vpcni-fuzz-$$f.log; then \
				echo "fuzz: $$f: Go's fuzzing coordinator failed on its own -fuzztime deadline with no failing input (golang/go#75804): running it once more"; \
				try=2; continue; \
			fi; \
			exit $$rc; \
		done; \
	done

fuzz-long:
	$(MAKE) fuzz FUZZTIME=10m

# vpcni-controller and the agents' cluster side against a real etcd +
# kube-apiserver only (internal/testbed/apiserver: the k8s-build binaries,
# loopback ports 26443/22379, state in /var/tmp/vpcni-apiserver; never the
# e2e node's). Per-node blocks: three vpcnid nodes from one config with
# pods reachable, reclaiming, racing writers, the controller binary with
# its lease and RBAC; the routed pod subnet's routes and pairs within the
# router's budget, on the lab's endpoint and on a lab; the PodNetwork CRD's
# schema and the pod webhook recording a pod's PodNetwork, in-process and
# the controller binary's (~50 s). test/doctorapi:
# vpcnictl doctor's API server check on a fixture of its own (ports
# 26473/22409): accepted, no such Node, refused token, no RBAC (~5 s).
# test/kubectlplugin: kubectl-vpcni finding a node's agent pod and each
# way that fails, RBAC, kubectl vpcni nodes, on its own fixture (ports
# 26483/22419, ~8 s; the exec itself runs in e2e-k8s, which has a kubelet).
# test/staticguard: the static provider in namespaces of its own (vpc26n,
# vpc26f) never hands out the node's, another Node's or a foreign host's
# address (ARP probe on a veth segment; ~10 s).
k8s-api: build k8s-build
	VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 5m -p 1 -v ./test/blocks ./test/fips ./test/leaks ./test/doctorapi ./test/kubectlplugin ./test/staticguard 2>&1 | tee /tmp/vpcni-k8s-api.log | $(TESTFILTER) ; exit $${PIPESTATUS[0]}
	VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 5m -v ./test/sticky 2>&1 | tee /tmp/vpcni-sticky.log | scripts/testfilter '^sticky-move' ; exit $${PIPESTATUS[0]}

# Root-only: real namespaces, the built plugin driven by libcni, Debian's
# reference plugins, a real neutron-server (scripts/neutron.sh installs and
# starts it, and stops it again). The Keystone job runs last, on its own:
# it restarts that neutron-server in Keystone mode (application credential,
# a TLS front with a CA of its own, a proxy, the policy's refusals). test/doctor runs
# vpcnictl doctor on a lab node with each planted fault (~1 s).
# scripts/testfilter keeps the RUN/PASS/FAIL lines, vpcni-test: lines and the
# summaries named here, and prints a failing test's own output under its
# FAIL line.
TESTFILTER := scripts/testfilter '^chaos:|^\[neutron|^pod-networks:'
integration: build
	VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout $(PKG_TEST_TIMEOUT) -v ./test/integration ./test/macvlan ./test/bridge ./test/neutron ./test/lab ./test/labnics ./test/doctor ./test/aws 2>&1 | tee /tmp/vpcni-integration.log | $(TESTFILTER) ; exit $${PIPESTATUS[0]}
	VPCNI_REQUIRE_ROOT=1 $(GO) test -count=1 -timeout $(PKG_TEST_TIMEOUT) -v ./test/keystone 2>&1 | tee /tmp/vpcni-keystone.log | $(TESTFILTER) ; exit $${PIPESTATUS[0]}

# The whole lab e2e — the lab's tests and the real Neutron agents' lab — with
# every node that runs mode veth in mode ebpf instead (VPCNI_ROUTED_MODE,
# internal/testbed): the fast path on top of every routed-veth scenario
# (~3.5 min; make test runs test/lab's TestEBPFLab, the mode's own e2e).
e2e-lab-ebpf: build
	VPCNI_ROUTED_MODE=ebpf VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout $(PKG_TEST_TIMEOUT) -v ./test/lab ./test/labagents 2>&1 | tee /tmp/vpcni-e2e-lab-ebpf.log | $(TESTFILTER) ; exit $${PIPESTATUS[0]}

# The lab e2e, once, against the real Neutron with its linuxbridge and L3
# agents (scripts/neutron.sh MODE=agents: brq bridges, iptables/ebtables port
# security, a qrouter- namespace). Its own state dir and ports (19697), so it
# never meets the API-mode server; the test brings it up and down. Then a
# PodNetwork's security groups enforced by the agent, with a real
# kube-apiserver (the cached Kubernetes build), printing `pod-networks: …`
# (~3 min in all).
e2e-neutron-agents: build k8s-build
	VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout $(PKG_TEST_TIMEOUT) -v ./test/labagents 2>&1 | tee /tmp/vpcni-e2e-neutron-agents.log | $(TESTFILTER) ; exit $${PIPESTATUS[0]}

# The NIC modes against a real Nova (Debian's Zed, fake virt driver) beside
# a real neutron-server with Keystone (scripts/nova.sh, its own state and
# ports): the os-interface contract, passthrough and secondary NICs as a
# project member, and the shared-network rule (~2 min, ~1 min more to
# install Nova's packages the first time).
e2e-nova:
	VPCNI_REQUIRE_ROOT=1 $(GO) test -count=1 -timeout $(PKG_TEST_TIMEOUT) -v ./test/nova 2>&1 | tee /tmp/vpcni-e2e-nova.log | $(TESTFILTER) ; exit $${PIPESTATUS[0]}

# vpcni on a real Kubernetes node (scripts/k8s-node.sh: etcd, control plane,
# containerd, kubelet and kube-proxy inside a lab node's namespace), installed
# with kubectl apply -k deploy/ and the image pulled by tag from a real
# registry on the node's loopback (scripts/registry.sh: this build's and the
# previous release's images pushed with crane; the upgrade rolls by tag).
# The Kubernetes build is cached.
# TestAWSNode runs the same install with provider aws on an AWS-style lab
# (the lab's EC2 endpoint and instance metadata); TestAWSPodNetworks puts
# PodNetworks on ENIs of their own there until the instance has no slot
# left, and the next one's pod stays Pending. TestBlocksInstall installs
# bare metal's per-node blocks (deploy/ with the deploy/blocks component,
# then the chart with blockRanges) on a fresh node (~2.2 min).
# TestMigrateFromBridge installs vpcni over a node whose pods run on Debian's
# bridge plugin and replaces them (docs/install-bare-metal.md, Replacing
# another CNI).
e2e-k8s: build image prev-image k8s-build registry
	VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) VPCNI_PREV_IMAGE=$(CURDIR)/$(BIN)/prev/vpcni-image.tar $(GO) test -count=1 -timeout 30m -v -run 'TestKubernetesNode|TestAWSNode|TestAWSPodNetworks|TestBlocksInstall|TestMigrateFromBridge' ./test/k8se2e 2>&1 | tee /tmp/vpcni-e2e-k8s.log | scripts/testfilter '^upgrade|^registry:' ; exit $${PIPESTATUS[0]}

# Upgrade in place on the real node: the node installed with the previous
# release (its deploy/ and image) and its pods, then this release applied
# while the legacy VM sends every pod an echo every 10 ms and an HTTP
# fetch every 100 ms (make test runs it
# inside e2e-k8s, which also rolls back and forward again later).
upgrade-e2e: build image prev-image k8s-build registry
	@VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) VPCNI_PREV_IMAGE=$(CURDIR)/$(BIN)/prev/vpcni-image.tar $(GO) test -count=1 -timeout 30m -v -run 'TestKubernetesNode/^upgrade$$' ./test/k8se2e 2>&1 | tee /tmp/vpcni-upgrade-e2e.log | scripts/testfilter '^upgrade detail' ; rc=$${PIPESTATUS[0]}; \
	grep '^upgrade:' /tmp/vpcni-upgrade-e2e.log | tail -1; exit $$rc

# vpcni on two real kubelets (scripts/k8s-node.sh up + join: the control
# plane and a kubelet in lab node 1, a second kubelet in lab node 2): one
# DaemonSet, cross-node pod<->pod, ClusterIP, NodePort and hostPort, then
# Kubernetes' own Granular Checks and HostPort conformance tests on the
# same cluster (test/k8se2e TestTwoNodes, ~2.5 min; in `make test`).
e2e-k8s-twonode: build image conformance-build
	VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 20m -v -run 'TestTwoNodes' ./test/k8se2e 2>&1 | tee /tmp/vpcni-e2e-k8s-twonode.log | scripts/testfilter 'k8s-e2e' ; exit $${PIPESTATUS[0]}

# The same node installed through the Helm chart instead (test/k8se2e
# TestHelmInstall): helm install of deploy/helm/vpcni into vpcni-system with
# values that say what the e2e overlay says, 10 pods checked as above, the
# metrics Services scraped from the legacy VM (the agent on the node's
# address), a helm upgrade that rolls the agent with every pod reachable,
# helm uninstall keeping the CRDs and their objects (~70 s on the node,
# ~2 min in all). Not in `make test` (its time budget): make helm
# there keeps the chart equal to deploy/; run this after changing either.
e2e-k8s-helm: build image k8s-build
	bash scripts/helm.sh >/dev/null
	VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 20m -v -run 'TestHelmInstall' ./test/k8se2e 2>&1 | tee /tmp/vpcni-e2e-k8s-helm.log | $(TESTFILTER) ; exit $${PIPESTATUS[0]}

# cri-tools' critest networking tests (unpatched, v1.36.0 as crictl) against
# the fixture's containerd (CRI_ONLY) in a lab node with vpcnid and
# deploy/10-vpcni.conflist (test/critest). Ends with `critest: passed=C/D`
# and writes $(CONFORMANCE_RESULTS)/critest.result for make conformance.
# Not in `make test`: a cold critest build is ~2-3 min. Holds the fixture's
# lock: other runs of the fixture share its state dir.
critest: build k8s-build
	bash scripts/cni-plugins.sh $(BIN)/cni-plugins
	bash scripts/critest.sh build >/dev/null
	flock /tmp/vpcni-k8s.lock env VPCNI_CONFORMANCE_DIR=$(CONFORMANCE_RESULTS) VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 15m -v ./test/critest 2>&1 | tee /tmp/vpcni-critest-run.log | scripts/testfilter '^critest:' ; exit $${PIPESTATUS[0]}

# Kubernetes' own [sig-network] conformance tests (every one: 47 at
# v1.36.3) against vpcni on two real nodes (test/k8se2e TestConformance):
# e2e.test and the agnhost, busybox, nginx, pause (and DNS) images the
# framework asks for, built from k8s.io/kubernetes at the
# fixture's version by scripts/conformance.sh (cached beside the fixture),
# run with --provider=local inside the first node's namespace. The last line is
# `conformance: k8s_passed=A/B critest_passed=C/D`; critest's figures come
# from $(CONFORMANCE_RESULTS)/critest.result when a critest step wrote it in
# this run (make conformance runs make critest first; a failed critest
# run writes its figures too). It fails when either failed, after the
# summary (critest's exit status waits in .critest-exit: a recipe line
# naming $(MAKE) runs even under make -n, so that line runs nothing else):
# critest, or the e2e — which also fails when the focus selects
# other than the number of specs pinned for the fixture's Kubernetes
# (internal/testbed/conformance; a focus of your own only has to select
# some). Not in `make test` (time budget): `make test` runs the Granular
# Checks and HostPort on two nodes in e2e-k8s-twonode. conformance-subset:
# those two only, here.
CONFORMANCE_RESULTS ?= /var/tmp/vpcni-conformance
CONFORMANCE_FOCUS   ?=
CONFORMANCE_SUBSET  := \[sig-network\] Networking Granular Checks: Pods|\[sig-network\] HostPort .*\[Conformance\]
conformance-build: k8s-build
	bash scripts/conformance.sh build

conformance: build image conformance-build
	@mkdir -p $(CONFORMANCE_RESULTS) && touch $(CONFORMANCE_RESULTS)/.started && rm -f $(CONFORMANCE_RESULTS)/.critest-exit
	mkdir -p $(CONFORMANCE_RESULTS); $(MAKE) critest CONFORMANCE_RESULTS=$(CONFORMANCE_RESULTS); echo $$? >$(CONFORMANCE_RESULTS)/.critest-exit
	VPCNI_CONFORMANCE=1 VPCNI_CONFORMANCE_RESULTS=$(CONFORMANCE_RESULTS) VPCNI_CONFORMANCE_FOCUS='$(CONFORMANCE_FOCUS)' VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 90m -v -run 'TestConformance' ./test/k8se2e 2>&1 | tee /tmp/vpcni-conformance.log | scripts/testfilter 'k8s-e2e' ; rc=$${PIPESTATUS[0]}; \
	VPCNI_CONFORMANCE_RESULTS=$(CONFORMANCE_RESULTS) bash scripts/conformance.sh summary; \
	cri=$$(cat $(CONFORMANCE_RESULTS)/.critest-exit 2>/dev/null || echo unknown); \
	[ "$$cri" = 0 ] || echo "conformance: FAILED: make critest exited $$cri (/tmp/vpcni-critest-run.log)"; \
	[ $$rc = 0 ] || echo "conformance: FAILED: the Kubernetes e2e exited $$rc (/tmp/vpcni-conformance.log)"; \
	[ "$$cri" = 0 ] && [ $$rc = 0 ]

conformance-subset:
	$(MAKE) conformance CONFORMANCE_FOCUS='$(CONFORMANCE_SUBSET)'

# Kubernetes' own dual-stack tests (test/k8se2e TestDualStackConformance):
# the [Feature:IPv6DualStack] specs of e2e.test (22 at v1.36.3, SCTP left
# out), then the [sig-network] conformance set again, both unpatched, on
# the two-node dual-stack cluster (the lab's network with an IPv6 subnet,
# Services and node addresses of both families, vpcni with ipFamilies
# [ipv4, ipv6]); results under $(CONFORMANCE_RESULTS)/dualstack*. Last
# line: `dualstack: k8s_passed=N/M conformance_passed=A/B`. Not in make
# test, which runs the dual-stack checks of TestTwoNodes.
dualstack: build image conformance-build
	@mkdir -p $(CONFORMANCE_RESULTS) && touch $(CONFORMANCE_RESULTS)/.started
	VPCNI_DUALSTACK=1 VPCNI_CONFORMANCE_RESULTS=$(CONFORMANCE_RESULTS) VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 150m -v -run 'TestDualStackConformance' ./test/k8se2e 2>&1 | tee /tmp/vpcni-dualstack.log | scripts/testfilter 'k8s-e2e' ; rc=$${PIPESTATUS[0]}; \
	VPCNI_CONFORMANCE_RESULTS=$(CONFORMANCE_RESULTS) bash scripts/conformance.sh dualstack-summary; \
	[ $$rc = 0 ] || echo "dualstack: FAILED: the Kubernetes e2e exited $$rc (/tmp/vpcni-dualstack.log)"; \
	[ $$rc = 0 ]

# The chaos tests at length (make test runs each with 3 rounds): against
# the real neutron-server (test/neutron), then against the lab's EC2
# endpoint with the aws provider (test/aws). A Neutron round took 5-34 s
# on this 2-core VM, 11-16 s on average (storm 4-14 s, then the checks and
# the ADDs back): 100 rounds about 20-27 min. An aws round took 4.5-23 s,
# 10 s on average (storm 4-10 s): 100 rounds about 17 min.
CHAOS_ROUNDS ?= 100
chaos: build
	VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) VPCNI_CHAOS_ROUNDS=$(CHAOS_ROUNDS) $(GO) test -count=1 -timeout 60m -v -run 'TestChaos' ./test/neutron 2>&1 | $(TESTFILTER) ; exit $${PIPESTATUS[0]}
	VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) VPCNI_CHAOS_ROUNDS=$(CHAOS_ROUNDS) $(GO) test -count=1 -timeout 60m -v -run 'TestChaos' ./test/aws 2>&1 | $(TESTFILTER) ; exit $${PIPESTATUS[0]}

# conformance-build-bg starts e2e.test's build (~1 min with the Go cache
# warm from k8s-build, ~9.5 min cold) in the background just before the
# integration suites, which mostly wait on their servers; e2e-k8s-twonode's
# conformance-build waits for it (scripts/conformance.sh builds once under
# a lock) and rebuilds if it failed. A make test that stops earlier leaves
# the build running to its end (log: $(CONFORMANCE_RESULTS)/build.log).
# release-build-bg likewise compiles vpcni for the other release
# architectures (arm64: ~7 min of CPU cold, seconds warm) into the Go build
# cache at the lowest priority, so that release-e2e, last, only links and
# packs; the tests before it keep the CPU when they want it.
test: deps lint verify-generate helm unit fuzz k8s-api conformance-build-bg release-build-bg integration e2e-neutron-agents e2e-nova e2e-k8s e2e-k8s-twonode release-e2e

conformance-build-bg: k8s-build
	@mkdir -p $(CONFORMANCE_RESULTS)
	@nohup bash scripts/conformance.sh build >$(CONFORMANCE_RESULTS)/build.log 2>&1 </dev/null &

# -trimpath as scripts/release.sh builds (the compile cache is keyed on it;
# the version is only in the link, which is not cached).
release-build-bg:
	@for a in $(filter-out $(shell $(GO) env GOARCH),$(RELEASE_ARCHES)); do \
		nohup nice -n 19 env GOARCH=$$a CGO_ENABLED=0 $(GO) build -trimpath ./cmd/... >/tmp/vpcni-release-build-$$a.log 2>&1 </dev/null & \
	done

demo: build
	$(BIN)/vpcnictl demo

bench: build
	$(BIN)/vpcnictl bench cni
	$(BIN)/vpcnictl bench datapath
	$(BIN)/vpcnictl bench datapath --family 6
	$(BIN)/vpcnictl bench modes
	$(BIN)/vpcnictl bench garp
	$(BIN)/vpcnictl bench garp --family 6 --prefix vpcni-ndpbench --subnet 10.94.6.0/24
	VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 5m -v -run TestStickyMove ./test/sticky 2>&1 | tee /tmp/vpcni-sticky-bench.log | grep -E '^(--- FAIL|FAIL)|^sticky-move|vpcni-test:' ; exit $${PIPESTATUS[0]}
	$(BIN)/vpcnictl bench selfheal
	$(BIN)/vpcnictl bench route-budget
	@started=0; bash scripts/neutron.sh status >/dev/null 2>&1 || { bash scripts/neutron.sh up && started=1; }; \
	$(BIN)/vpcnictl bench neutron && $(BIN)/vpcnictl bench pool; rc=$$?; \
	[ $$started = 1 ] && bash scripts/neutron.sh down; exit $$rc
	$(BIN)/vpcnictl bench pool --provider aws
	$(BIN)/vpcnictl bench restart
	$(MAKE) image k8s-build
	$(BIN)/vpcnictl bench node-scale
	$(MAKE) bench-startup
	VPCNI_K8S_BENCH=1 VPCNI_K8S_BENCH_ROUNDS=0 VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 40m -v -run 'TestK8sBench' ./test/k8se2e 2>&1 | tee /tmp/vpcni-k8s-bench.log | grep -E '^(--- |FAIL|ok|bench:|k8s-bench:|bandwidth:)|node_test|bench_test|chain_test|vpcni-test:' ; exit $${PIPESTATUS[0]}

# Pod startup at scale on two real nodes (test/k8se2e TestPodStartup):
# batches of 2 x 100 pods with vpcni, Debian's bridge plugin and no CNI
# (hostNetwork: the floor), all three every round in a rotating order
# (3 rounds); prints the pod-startup: line. Part of `make bench`.
bench-startup: build image k8s-build
	VPCNI_K8S_BENCH=1 VPCNI_REQUIRE_ROOT=1 VPCNI_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 60m -v -run 'TestPodStartup' ./test/k8se2e 2>&1 | tee /tmp/vpcni-pod-startup.log | grep -E '^(--- |FAIL|ok|bench:|pod-startup:)|startup_test|vpcni-test:' ; exit $${PIPESTATUS[0]}

# vpcni-controller at 1,000 nodes and 30,000 pods, by simulation (test/scale):
# kwok (built from its Go module by scripts/kwok.sh, cached in
# /var/cache/vpcni-kwok) fakes the Nodes and their pods against a real etcd
# and kube-apiserver of the bench's own (loopback ports 26493/22429, state
# in /var/tmp/vpcni-scale); the vpcni-controller binary runs as its
# service account with its webhook called by the API server for every
# pod, per-node blocks, the routed pod subnet and the leak collector on
# the lab's Neutron endpoint; the bench writes what each node's agent
# would (its block request, a PodAddress per pod). Ends with the scale:
# line. SCALE_NODES, SCALE_PODS and SCALE_RATE (pods/s) size it: the
# default run took 18.5 min of the whole machine here; 100 nodes and 3,000
# pods 3-5 min. Not in make test or make bench.
SCALE_NODES ?= 1000
SCALE_PODS  ?= 30000
SCALE_RATE  ?= 50
bench-scale: build k8s-build
	kwok=$$(bash scripts/kwok.sh) && \
	VPCNI_SCALE=1 VPCNI_KWOK=$$kwok VPCNI_SCALE_NODES=$(SCALE_NODES) VPCNI_SCALE_PODS=$(SCALE_PODS) VPCNI_SCALE_RATE=$(SCALE_RATE) \
	VPCNI_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 90m -v -run TestScale ./test/scale 2>&1 | tee /tmp/vpcni-bench-scale.log | grep -E '^(--- |FAIL|ok|panic)|vpcni-test:|^scale:|scale_test' ; exit $${PIPESTATUS[0]}

clean:
	rm -rf $(BIN)
