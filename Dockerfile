# syntax=docker/dockerfile:1
#
# cloudscale-autoscaler image: the Cluster Autoscaler externalgrpc provider for cloudscale.ch.
#   docker build -t cloudscale-autoscaler:0.1.0 .
# Runs as UID/GID 10001 with nothing to write outside /tmp and the creation journal's
# directory, so it works under runAsNonRoot + readOnlyRootFilesystem (deploy/kustomize,
# deploy/helm).

# Debian 12 (bookworm), pinned: the builder's Rust comes from bookworm-security's rustc-web
# (1.88 or newer, as rust/Cargo.toml's rust-version asks), which later Debian releases do not
# have (trixie's plain rustc 1.85 is too old). A toolchain below rust-version makes cargo stop
# the build with a message naming the version needed.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: wheels for the project and every dependency --------------------------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
# The compiled transport (rust/) needs a Rust toolchain: rustc-web (see PYTHON_IMAGE; plain
# rustc is too old for tonic and rustls). Only this stage has it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends rustc-web cargo-web gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && cargo --version
WORKDIR /src
# Only what the build needs (.dockerignore keeps the context to these). The generated protobuf
# modules are committed under src/, so no protoc runs here; Cargo.lock pins every crate.
COPY pyproject.toml README.md ./
COPY rust ./rust
COPY src ./src
# pip and cargo download over HTTPS with their own CA bundles. Behind a TLS-inspecting proxy
# (or a private mirror) give the build your trust store as the optional secret
# `ca-certificates` (docs/deployment.md); without it they use their own.
# The cache mounts keep downloaded wheels and crates and cargo's compiled dependencies between
# builds (never in a layer), so a changed source file recompiles only the transport itself.
RUN --mount=type=secret,id=ca-certificates \
    --mount=type=cache,id=cloudscale-autoscaler-pip,target=/root/.cache/pip \
    --mount=type=cache,id=cloudscale-autoscaler-cargo-registry,target=/root/.cargo/registry \
    --mount=type=cache,id=cloudscale-autoscaler-cargo-target,target=/cargo-target \
    if [ -f /run/secrets/ca-certificates ]; then \
        export PIP_CERT=/run/secrets/ca-certificates \
               CARGO_HTTP_CAINFO=/run/secrets/ca-certificates \
               SSL_CERT_FILE=/run/secrets/ca-certificates; \
    fi \
    && CARGO_TARGET_DIR=/cargo-target pip wheel --wheel-dir /wheels . \
    && (cd /wheels && sha256sum *.whl) > /wheels.sha256

# --- runtime: the base with the installed wheels, trimmed to what the server runs ---------
FROM ${PYTHON_IMAGE} AS runtime
# The checksums of the wheels installed below: a record of what the image holds, and what makes
# podman's layer cache redo the install when they change (it does not look into bind mounts).
COPY --from=builder /wheels.sha256 /usr/local/share/cloudscale-autoscaler/wheels.sha256
# Install from the builder's wheels through a bind mount, so they never become a layer, without
# bytecode (see below); then drop pip/setuptools/wheel, which nothing needs at run time.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --no-compile --find-links=/wheels cloudscale-autoscaler \
    && pip uninstall --yes pip setuptools wheel
# Bytecode only for what runs: every module of the project and whatever they import (grpc,
# cryptography, aiohttp, ...), but not the kubernetes client's, 20 MB of bytecode for its ~1,000
# API and model modules, compiled in memory at start instead (about 1 s). What is never
# imported (an unused module of a dependency) gets none either.
RUN python -c 'import importlib, pkgutil, cloudscale_autoscaler as p; \
[importlib.import_module(m.name) for m in pkgutil.walk_packages(p.__path__, p.__name__ + ".") \
 if not m.name.endswith("__main__")]' \
    && python -c 'import kubernetes, pathlib, shutil; \
[shutil.rmtree(c) for c in pathlib.Path(kubernetes.__file__).parent.rglob("__pycache__")]'
# A fixed numeric UID/GID: Kubernetes can check runAsNonRoot only against a number, and the
# manifests set runAsUser/fsGroup 10001 to match.
RUN groupadd --system --gid 10001 cloudscale-autoscaler \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin cloudscale-autoscaler \
    && mkdir -p /etc/cloudscale-autoscaler \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/cloudscale-autoscaler
# What the server never runs, removed as packages (dpkg's record stays true, which the SBOM
# reads): the package manager's front end, its keys and the libraries only it links (gnutls,
# gcrypt, systemd's), perl (mailcap's), bash (sh is dash), the login, mount and archive tools,
# pip's wheel. Kept: Python and the libraries it links, dash and coreutils (probes and
# `kubectl exec` use sh, cat, ls), dpkg's record, the CA certificates.
RUN for package in apt libapt-pkg6.0 gpgv debian-archive-keyring libgnutls30 libp11-kit0 \
        libtasn1-6 libnettle8 libhogweed6 libidn2-0 libunistring2 libgcrypt20 libgpg-error0 \
        libsystemd0 libudev1 libseccomp2 libxxhash0 liblz4-1 perl perl-base perl-modules-5.36 \
        libperl5.36 mailcap bash login passwd util-linux mount bsdutils tar gzip diffutils \
        findutils hostname ncurses-bin sysvinit-utils init-system-helpers e2fsprogs logsave \
        libss2 libext2fs2 libdb5.3 libsemanage2 libsemanage-common libsepol2 libaudit1 \
        libaudit-common libpam0g libpam-modules libpam-modules-bin libpam-runtime \
        python3-pip-whl; do \
      if dpkg-query --show --showformat='${db:Status-Status}' "$package" 2>/dev/null \
         | grep -qx installed; then set -- "$@" "$package"; fi; \
    done \
    && dpkg --purge --force-remove-essential --force-depends "$@" \
    && rm -rf /var/cache/* /var/lib/apt /var/log/* /usr/share/doc /usr/share/man \
       /usr/share/info /usr/share/locale /usr/share/lintian /tmp/* /root/.cache

# --- final: one layer of the trimmed runtime, no compiler, no build context ------------------
# FROM scratch: what the runtime stage removed is not in the image at all (on top of the base,
# removed files would still be in the base's layers).
FROM scratch
COPY --from=runtime / /
# STATE_DIRECTORY: where the creation journal lives without stateDir and without a Kubernetes
# namespace (docs/deployment.md): writable by UID 10001; with a read-only root filesystem,
# mount a volume there (the chart's emptyDir, or a persistent one).
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    STATE_DIRECTORY=/var/lib/cloudscale-autoscaler
USER 10001:10001
# 8086: gRPC (mTLS) for Cluster Autoscaler; 8080: /metrics, /healthz, /readyz.
EXPOSE 8086 8080
ENTRYPOINT ["cloudscale-autoscaler"]
CMD ["serve", "--config", "/etc/cloudscale-autoscaler/config/config.yaml"]
