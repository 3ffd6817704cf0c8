# syntax=docker/dockerfile:1
# meshfed's images: the hub (the default, last stage) and the minion (target "minion"),
# static binaries on distroless, running as the distroless nonroot user (65532, the user
# deploy/ runs them as).
#
#   docker build -t meshfed/hub .
#   docker build --target minion -t meshfed/minion .
#
# The hub image holds both binaries, so it can also run the minion:
#   docker run --entrypoint /usr/local/bin/minion meshfed/hub -config ...
#
# Builds for other platforms cross-compile in the build stage
# (docker buildx build --platform linux/amd64,linux/arm64 ...).

# The Go version of go.mod's go directive (checked by deploy's TestDockerfileShape).
ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src
# Modules first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/hub ./cmd/minion

FROM gcr.io/distroless/static-debian12:nonroot AS minion
COPY --from=build /out/hub /out/minion /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/minion"]

FROM gcr.io/distroless/static-debian12:nonroot AS hub
COPY --from=build /out/hub /out/minion /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/hub"]
