// The controller-runtime peer: the ManagedWorkload contract written the way most Go operators
// are written (kubebuilder's layout, controller-runtime's manager, informer cache and
// CreateOrUpdate), so that `make bench` can say what the same job costs done that way.
// hack/bench.sh builds it; tests/bench_operator/peer.rs runs it. It is not the product.
//
//	peer --kubeconfig FILE [--namespace NS]
package main

import (
	"flag"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

func main() {
	// --kubeconfig is registered by controller-runtime's config package, as in every
	// kubebuilder main.go.
	var namespace string
	flag.StringVar(&namespace, "namespace", "", "watch and reconcile this namespace only (default: all namespaces)")
	logOptions := zap.Options{}
	logOptions.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&logOptions)))
	log := ctrl.Log.WithName("setup")

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(AddToScheme(scheme))

	// ctrl.GetConfig leaves client-side rate limiting off (QPS -1), relying on the API
	// server's priority and fairness; that is kept. The operator it is compared with has no
	// client-side limit either, so a token bucket here would measure the bucket, not the
	// controller.
	config := ctrl.GetConfigOrDie()

	cacheOptions := cache.Options{}
	if namespace != "" {
		// Confines the informers, and so the reconciler, to one namespace.
		cacheOptions.DefaultNamespaces = map[string]cache.Config{namespace: {}}
	}
	mgr, err := ctrl.NewManager(config, ctrl.Options{
		Scheme: scheme,
		Cache:  cacheOptions,
		// No metrics server and no health probes: nothing scrapes or probes this process,
		// and neither should cost it anything.
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// One instance only; leader election would add a Lease renewal every few seconds.
		LeaderElection: false,
	})
	if err != nil {
		log.Error(err, "unable to create the manager")
		os.Exit(1)
	}
	if err := (&ManagedWorkloadReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme()}).SetupWithManager(mgr); err != nil {
		log.Error(err, "unable to create the controller")
		os.Exit(1)
	}
	log.Info("starting the manager", "namespace", namespace)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "the manager stopped")
		os.Exit(1)
	}
}
