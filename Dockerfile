# ivserve on Debian 12.  Build: docker build -t ivserve .
# Run:   docker run -p 8080:8080 -v /data:/data ivserve --listen 0.0.0.0 /data/atlas.h5ad
FROM debian:12-slim AS build
WORKDIR /src
COPY . .
RUN scripts/setup.sh --build \
 && cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIV_TESTS=OFF \
 && cmake --build build -j"$(nproc)" --target ivserve

FROM debian:12-slim
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends libuv1 libzstd1 liblz4-1 libhdf5-103-1 \
      libcjson1 libjemalloc2 zlib1g libbrotli1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --no-create-home ivserve
COPY --from=build /src/build/ivserve /usr/local/bin/ivserve
COPY --from=build /src/examples/pbmc_example.h5ad /usr/share/ivserve/pbmc_example.h5ad
USER ivserve
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/ivserve"]
CMD ["--listen", "0.0.0.0", "/usr/share/ivserve/pbmc_example.h5ad"]
