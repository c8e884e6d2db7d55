// Command reverseproxy is the yardstick of make bench-hop: Go's own httputil.ReverseProxy with a
// Transport tuned for a hop on loopback, round robin over the workers named on the command line,
// and nothing else (no authentication, no queue, no parsing): the limit of the stack usher is
// built on.
//
//	reverseproxy -listen 127.0.0.1:18085 http://127.0.0.1:18001 http://127.0.0.1:18002
package main

import (
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:18085", "address to listen on")
	flag.Parse()
	var workers []*url.URL
	for _, arg := range flag.Args() {
		u, err := url.Parse(arg)
		if err != nil {
			log.Fatalf("worker %q: %v", arg, err)
		}
		workers = append(workers, u)
	}
	if len(workers) == 0 {
		log.Fatal("name at least one worker URL")
	}
	var next atomic.Uint64
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(workers[next.Add(1)%uint64(len(workers))])
		},
		Transport: &http.Transport{
			MaxIdleConns:        4096,
			MaxIdleConnsPerHost: 1024,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
		FlushInterval: -1, // every write of a stream goes out at once, as usher's do
	}
	log.Fatal(http.ListenAndServe(*listen, proxy))
}
