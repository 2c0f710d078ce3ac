# The manager image for a container engine: the image release/build-image makes without
# one (config/README.md, "The image"). From scratch: /captf, statically linked against
# glibc; the users and name resolution of release/rootfs/; a /tmp and the home of user
# 65532 (nonroot), which it runs as; `/captf manager` unless the Pod gives other args
# (config/manager/manager.yaml gives only args).
#   docker build -t <registry>/captf:<version> .
# Then point the manifests at it:
#   (cd config/manager && kustomize edit set image captf=<registry>/captf:<version>)

FROM docker.io/library/rust:1.95-bookworm AS builder
WORKDIR /src
# The whole workspace (tests/faultproxy and tests/support are members: cargo reads their
# manifests).
COPY . .
# +crt-static with --target: the binary is static (glibc's static libraries come with the
# builder's libc6-dev), while build scripts and proc macros link as usual.
RUN triple="$(uname -m)-unknown-linux-gnu" \
 && flags="CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_RUSTFLAGS" \
 && env "$flags=-C target-feature=+crt-static" \
      cargo build --release --locked --target "$triple" --bin captf \
 && cp "target/$triple/release/captf" /captf \
 && if ldd /captf 2>&1 | grep -q '=>'; then echo "/captf is not static" >&2; exit 1; fi
RUN mkdir -p /rootfs /home/nonroot \
 && cp -r release/rootfs/. /rootfs/ \
 && chmod 0644 /rootfs/etc/* \
 && mkdir -m 1777 /rootfs/tmp \
 && chmod 0700 /home/nonroot

FROM scratch
COPY --from=builder /rootfs/ /
COPY --from=builder --chown=65532:65532 /home/nonroot /home/nonroot
COPY --from=builder /captf /captf
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LABEL org.opencontainers.image.title="captf" \
      org.opencontainers.image.description="CAPTF: a Cluster API infrastructure provider whose infrastructure is a Terraform module" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
ENTRYPOINT ["/captf"]
CMD ["manager"]
