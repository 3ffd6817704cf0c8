module github.com/meshfed/meshfed/test/istio

go 1.26

require (
	github.com/gogo/protobuf v1.3.1
	golang.org/x/time v0.0.0-20200630173020-3af7569d3a1e
	google.golang.org/grpc v1.33.1
	istio.io/api v0.0.0-20201112235759-fa4ee46c5dc2
	istio.io/istio v0.0.0-20201118224433-c87a4c874df2
	istio.io/pkg v0.0.0-20201112235759-c861803834b2
)

require (
	github.com/cenkalti/backoff v2.2.1+incompatible // indirect
	github.com/go-logr/logr v0.2.1 // indirect
	github.com/golang/protobuf v1.4.3 // indirect
	github.com/inconshreveable/mousetrap v1.0.0 // indirect
	github.com/natefinch/lumberjack v2.0.0+incompatible // indirect
	github.com/spf13/cobra v1.0.0 // indirect
	github.com/spf13/pflag v1.0.5 // indirect
	go.opencensus.io v0.22.5 // indirect
	go.uber.org/atomic v1.7.0 // indirect
	go.uber.org/multierr v1.6.0 // indirect
	go.uber.org/zap v1.16.0 // indirect
	golang.org/x/crypto v0.0.0-20201016220609-9e8e0b390897 // indirect
	golang.org/x/net v0.0.0-20200904194848-62affa334b73 // indirect
	golang.org/x/sys v0.0.0-20200826173525-f9321e4c35a6 // indirect
	golang.org/x/text v0.3.3 // indirect
	google.golang.org/genproto v0.0.0-20201019141844-1ed22bb0c154 // indirect
	google.golang.org/protobuf v1.25.0 // indirect
	gopkg.in/square/go-jose.v2 v2.5.1 // indirect
	istio.io/gogo-genproto v0.0.0-20201112235858-7e611cb4d738 // indirect
	k8s.io/klog/v2 v2.3.0 // indirect
)

// k8s.io/kubectl v0.19.3 (required by istio.io/istio's go.mod) requires the
// dead vanity module vbom.ml/util; the module proxy no longer serves it.
// Its code lives on as github.com/fvbommel/util at the same commit.
replace vbom.ml/util => github.com/fvbommel/util v0.0.0-20160121211510-db5cfe13f5cc
