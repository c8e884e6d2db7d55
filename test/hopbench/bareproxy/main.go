// Command bareproxy is the floor of make bench-hop: the least a Go net/http proxy can do, round
// robin over the workers named on the command line. The upstream request is written and its
// answer read on the handler's own goroutine, over a pool of kept-alive connections of its own,
// so none of net/http Transport's goroutine hand-offs (its read and write loops) are in the path;
// no authentication, no parsing, no timeouts, no retries. Not a product: it tells how much of a
// hop's latency is net/http's server and the Go runtime rather than any proxy's own work.
//
//	bareproxy -listen 127.0.0.1:18086 http://127.0.0.1:18001 http://127.0.0.1:18002
package main

import (
	"bufio"
	"bytes"
	"flag"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
)

// conn is one kept-alive connection to a worker.
type conn struct {
	net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

// upstream is one worker and its idle connections.
type upstream struct {
	addr string
	mu   sync.Mutex
	idle []*conn
}

func (u *upstream) get() (*conn, error) {
	u.mu.Lock()
	if n := len(u.idle); n > 0 {
		c := u.idle[n-1]
		u.idle = u.idle[:n-1]
		u.mu.Unlock()
		return c, nil
	}
	u.mu.Unlock()
	c, err := net.Dial("tcp", u.addr)
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, r: bufio.NewReaderSize(c, 16<<10), w: bufio.NewWriterSize(c, 16<<10)}, nil
}

func (u *upstream) put(c *conn) {
	u.mu.Lock()
	u.idle = append(u.idle, c)
	u.mu.Unlock()
}

// serve relays r to u and its answer to w, flushing every read so a stream goes out as it comes.
func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out, err := http.NewRequest(r.Method, "http://"+u.addr+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out.Header = r.Header.Clone()
	c, err := u.get()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if err := out.Write(c.w); err == nil {
		err = c.w.Flush()
	}
	var resp *http.Response
	if err == nil {
		resp, err = http.ReadResponse(c.r, out)
	}
	if err != nil {
		c.Close()
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				rerr = werr
			} else if flusher != nil {
				flusher.Flush()
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			c.Close() // the answer was not read to its end: the connection cannot be reused
			return
		}
	}
	resp.Body.Close()
	if resp.Close {
		c.Close()
		return
	}
	u.put(c)
}

func main() {
	listen := flag.String("listen", "127.0.0.1:18086", "address to listen on")
	flag.Parse()
	var ups []*upstream
	for _, arg := range flag.Args() {
		u, err := url.Parse(arg)
		if err != nil || u.Scheme != "http" || u.Host == "" {
			log.Fatalf("worker %q: want http://host:port", arg)
		}
		ups = append(ups, &upstream{addr: u.Host})
	}
	if len(ups) == 0 {
		log.Fatal("name at least one worker URL")
	}
	var next atomic.Uint64
	log.Fatal(http.ListenAndServe(*listen, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ups[next.Add(1)%uint64(len(ups))].serve(w, r)
	})))
}
