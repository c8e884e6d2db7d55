// Package adminui holds the admin console's assets: html/template pages and the CSS and
// JavaScript they load, embedded in the binary. It has no logic; the gateway package renders
// the templates and serves the static files at /admin/static/.
//
// Every page template defines "title" and "content" and is parsed together with layout.html,
// whose "layout" template frames them. Pages that refresh live define a fragment ("overview-live",
// "workers-live") the gateway also serves alone for polling.
package adminui

import "embed"

// Files holds templates/*.html and static/*.
//
//go:embed templates/*.html static/*
var Files embed.FS
