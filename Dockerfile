# ivserve on Debian 12.
#
#   docker build -t ivserve .
#   docker run -p 8080:8080 -v /srv/atlases:/data:ro ivserve /data/atlas.h5ad
#   docker run -p 8080:8080 -v /srv/atlases:/data:ro ivserve --config /data/ivserve.json
#
# With podman and no registry (as deploy/podman/run.sh does it): build with
# --format docker (the OCI format has no HEALTHCHECK) and --build-arg
# BASE=<a local Debian 12 image>.
#
# Why two stages: the build stage runs the project's own set-up script, so
# the image is built with exactly the packages a developer's machine gets;
# the runtime stage installs only the Debian packages that hold the
# libraries the binary links against, found with ldd and dpkg in the build
# stage rather than listed here by hand, so a new library cannot be
# forgotten.  dpkg knows a file by the path its package installed, which
# merged /usr can make differ from ldd's by a /usr prefix or a symlink, so
# each of the three forms is asked.
ARG BASE=debian:12-slim

FROM ${BASE} AS build
WORKDIR /src
COPY . .
RUN scripts/setup.sh --build \
 && cmake -S . -B /build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIV_TESTS=OFF >/dev/null \
 && cmake --build /build -j"$(nproc)" --target ivserve \
 && for f in $(ldd /build/ivserve | awk '$3 ~ /^\// { print $3 }'); do \
      r=$(readlink -f "$f"); dpkg -S "$f" "$r" "${r#/usr}" 2>/dev/null | head -n1 | cut -d: -f1; \
    done | sort -u > /build/runtime-packages \
 && test -s /build/runtime-packages

FROM ${BASE}
COPY --from=build /build/runtime-packages /usr/share/ivserve/runtime-packages
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      $(cat /usr/share/ivserve/runtime-packages) \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin ivserve
COPY --from=build /build/ivserve /usr/local/bin/ivserve
COPY --from=build /src/examples/pbmc_example.h5ad /usr/share/ivserve/pbmc_example.h5ad

# In a container the server must listen on every address (its default is
# loopback).  The environment overrides a config file, so only the address
# is set here, not the port: the port is the config's or 8080, and a
# server on another port should get IVSERVE_PORT, which the health check
# reads too.  The check speaks HTTP through bash's /dev/tcp because the
# runtime stage has no curl.
ENV IVSERVE_LISTEN=0.0.0.0
# A numeric user, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
EXPOSE 8080
# Datasets are mounted here read-only (-v HOST_DIR:/data:ro); the server
# only ever reads them.
VOLUME ["/data"]
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${IVSERVE_PORT:-8080} && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["/usr/local/bin/ivserve"]
CMD ["/usr/share/ivserve/pbmc_example.h5ad"]
