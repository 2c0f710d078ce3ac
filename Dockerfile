# The manager image: `captf` on a distroless base, non-root.
#   docker build -t <registry>/captf:<version> .
# Then point the manifests at it:
#   (cd config/manager && kustomize edit set image captf=<registry>/captf:<version>)

FROM docker.io/library/rust:1.95 AS builder
WORKDIR /src
# The whole workspace (tests/testserver is a member, so cargo needs its manifest).
COPY . .
RUN cargo build --release --locked --bin captf \
 && cp target/release/captf /captf

# glibc (the binary is dynamically linked against it), no shell, user 65532 (nonroot).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /captf /captf
USER 65532:65532
ENTRYPOINT ["/captf"]
