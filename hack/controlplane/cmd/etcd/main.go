// etcd's server, built from the module proxy at the version Kubernetes pins.
// The etcd root module cannot be `go install`ed (it replaces its own submodules
// with local paths), so this thin main calls the same entry point it does.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
