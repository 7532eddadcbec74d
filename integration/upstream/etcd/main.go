// The etcd server, as the etcd binary of go.etcd.io/etcd/v3 builds it (its main calls etcdmain).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
