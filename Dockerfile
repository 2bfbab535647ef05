# syncloop's image: a static binary (CGO_ENABLED=0) on distroless "static",
# running as an unprivileged user. Build with `make image`.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION}" -o /out/syncloop ./cmd/syncloop

# No shell, no package manager: only the binary, CA certificates and tzdata.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/syncloop /usr/local/bin/syncloop
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/syncloop"]
