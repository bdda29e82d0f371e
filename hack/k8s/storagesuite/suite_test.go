//go:build k8se2e

// Package storagesuite is Kubernetes' external storage e2e suite without the
// rest of Kubernetes' e2e tests: the specs that
// k8s.io/kubernetes/test/e2e/storage/external defines for each
// -storage.testdriver definition, run by the e2e framework with the flags of
// e2e.test. hack/k8s/install.sh copies it into its wrapper module of
// k8s.io/kubernetes and builds it with go test -c as storage-e2e.test; the
// build tag keeps it out of csi-fastblk's own module, which does not require
// k8s.io/kubernetes. Linking only these packages, not all of test/e2e, is what
// makes the binary cheap enough to build in every CI run.
package storagesuite

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"k8s.io/component-base/logs"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	e2enode "k8s.io/kubernetes/test/e2e/framework/node"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2emanifests "k8s.io/kubernetes/test/e2e/testing-manifests"

	// Logging flags, as e2e.test has them.
	_ "k8s.io/component-base/logs/testinit"
	// The storage suites, registered for each -storage.testdriver.
	_ "k8s.io/kubernetes/test/e2e/storage/external"
	// What e2e.test adds to every spec: a dump of the namespace's objects
	// and events when it fails, and the check that every node is still
	// ready after it.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/format"
)

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unexpected arguments: %q\n", flag.Args())
		os.Exit(2)
	}
	testfiles.AddFileSource(e2emanifests.GetE2ETestingManifestsFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	if root := framework.TestContext.RepoRoot; root != "" {
		testfiles.AddFileSource(testfiles.RootFileSource{Root: root})
	}
	os.Exit(m.Run())
}

// The specs start only on schedulable nodes, and the suites that spread pods
// over nodes read their number from the cluster, as e2e.test's own setup
// does.
var _ = ginkgo.SynchronizedBeforeSuite(func(ctx context.Context) []byte {
	c, err := framework.LoadClientset()
	framework.ExpectNoError(err, "loading the client")
	framework.ExpectNoError(e2enode.WaitForAllNodesSchedulable(ctx, c, framework.NewTimeoutContext().NodeSchedulable))
	return nil
}, func(ctx context.Context, _ []byte) {
	if framework.TestContext.CloudConfig.NumNodes != framework.DefaultNumNodes {
		return
	}
	c, err := framework.LoadClientset()
	framework.ExpectNoError(err, "loading the client")
	nodes, err := e2enode.GetReadySchedulableNodes(ctx, c)
	framework.ExpectNoError(err, "listing the schedulable nodes")
	framework.TestContext.CloudConfig.NumNodes = len(nodes.Items)
})

func TestStorage(t *testing.T) {
	// As in e2e.test: klog through the framework's logger, contextual
	// logging on (InitLogs turns it off).
	logs.InitLogs()
	defer logs.FlushLogs()
	klog.EnableContextualLogging(true)
	gomega.RegisterFailHandler(framework.Fail)
	suite, reporter := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "Kubernetes external storage suite", suite, reporter)
}
