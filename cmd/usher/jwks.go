package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/usherllm/usher/tenants"
)

// maxJWKSBytes bounds a fetched key set: a few dozen keys take a few KiB.
const maxJWKSBytes = 1 << 20

// httpJWKSFetcher fetches jwt.jwks_url for package tenants, which does no HTTP. Redirects are
// not followed: the key set's location is the configured one.
type httpJWKSFetcher struct{ client *http.Client }

var _ tenants.JWKSFetcher = httpJWKSFetcher{}

func newJWKSFetcher() httpJWKSFetcher {
	return httpJWKSFetcher{client: &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// FetchJWKS GETs url within ctx and returns its body (at most maxJWKSBytes) and the max-age of its
// Cache-Control (0 when absent; -1 when no-store or no-cache forbid keeping it).
func (f httpJWKSFetcher) FetchJWKS(ctx context.Context, url string) ([]byte, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, 0, err
	}
	if len(body) > maxJWKSBytes {
		return nil, 0, errors.New("the key set exceeds 1 MiB")
	}
	return body, cacheMaxAge(resp.Header.Get("Cache-Control")), nil
}

// cacheMaxAge reads max-age from a Cache-Control header: 0 when it says none, -1 for no-store and
// no-cache.
func cacheMaxAge(header string) time.Duration {
	var age time.Duration
	for _, d := range strings.Split(header, ",") {
		name, value, _ := strings.Cut(strings.TrimSpace(d), "=")
		switch strings.ToLower(name) {
		case "no-store", "no-cache":
			return -1
		case "max-age":
			if n, err := strconv.ParseInt(strings.Trim(value, `"`), 10, 64); err == nil && n > 0 && n < 1<<31 {
				age = time.Duration(n) * time.Second
			}
		}
	}
	return age
}
