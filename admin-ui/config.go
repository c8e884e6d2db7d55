package adminui

import (
	"errors"
	"fmt"
)

// Config is the `admin_ui:` section of usher's configuration. Zero fields take the defaults of
// SetDefaults.
type Config struct {
	// SignIn bounds guessing the admin, viewer and tenant credentials through the admin plane.
	SignIn SignInLimits `yaml:"sign_in"`
}

// SignInLimits bound the failed credential checks of console sign-ins and admin API calls: per
// client address and for all clients together. Each failure takes one attempt; attempts come back
// evenly over a minute. A client with no attempt left, or, past the global bound, a client that
// failed within the last minute, is refused with 429 and a Retry-After before its credential is
// checked, right or wrong. A missing credential or a refused CSRF token is not an attempt.
type SignInLimits struct {
	// PerClientPerMinute is the failed attempts one client address may make per minute, all at
	// once or spread. Default 10.
	PerClientPerMinute int `yaml:"per_client_per_minute"`
	// GlobalPerMinute is the failed attempts all clients together may make per minute, against
	// guessing from many addresses. Past it the admin plane refuses the clients that failed
	// within the last minute, until attempts come back, so each guessing address gets at most
	// one guess a minute; an address whose credential was accepted within a day, or that has not
	// failed, still gets in, unless more than twice this many addresses are failing at once.
	// Default 100.
	GlobalPerMinute int `yaml:"global_per_minute"`
}

// SetDefaults fills every zero field with its default.
func (c *Config) SetDefaults() {
	if c.SignIn.PerClientPerMinute == 0 {
		c.SignIn.PerClientPerMinute = 10
	}
	if c.SignIn.GlobalPerMinute == 0 {
		c.SignIn.GlobalPerMinute = 100
	}
}

// Validate reports every invalid field, each error naming the field as it is written in YAML.
func (c Config) Validate() error {
	var errs []error
	if c.SignIn.PerClientPerMinute <= 0 {
		errs = append(errs, fmt.Errorf("admin_ui.sign_in.per_client_per_minute: must be positive, got %d", c.SignIn.PerClientPerMinute))
	}
	if c.SignIn.GlobalPerMinute < c.SignIn.PerClientPerMinute {
		errs = append(errs, fmt.Errorf("admin_ui.sign_in.global_per_minute: must be at least per_client_per_minute (%d), got %d",
			c.SignIn.PerClientPerMinute, c.SignIn.GlobalPerMinute))
	}
	return errors.Join(errs...)
}
