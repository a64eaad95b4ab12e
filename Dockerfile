# One image with the three Basecamp binaries: basecamp, basecamp-operator,
# basecamp-sandbox. Build: `make image` (needs a Docker engine).

# ---- build ------------------------------------------------------------------
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# Dependencies first, so a source change does not refetch crates.
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY proto proto
COPY api api
COPY trace trace
COPY sandbox-pod sandbox-pod
COPY operator operator
COPY cli cli
COPY gpu gpu
COPY bench/support bench/support
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins \
 && mkdir -p /out \
 && cp target/release/basecamp target/release/basecamp-operator target/release/basecamp-sandbox /out/

# ---- runtime: no shell, no package manager, uid 65532 -----------------------
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/basecamp-operator"]
