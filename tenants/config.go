package tenants

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Config is the tenants part of the usher configuration file. It is embedded inline at the top
// level of the YAML file. The zero value plus SetDefaults is a valid config with no tenants.
type Config struct {
	// Tenants are the read-only tenants declared in the file. They authenticate with the API
	// keys listed here and cannot be changed through the admin API.
	Tenants []TenantSpec `yaml:"tenants"`
	// Tiers are the SLA tiers, highest first. When none is declared, SetDefaults declares one
	// unlimited tier named BuiltinTier.
	Tiers []Tier `yaml:"tiers"`
	// DefaultTier is the tier of a tenant that names none: default BuiltinTier when such a tier
	// exists, else the last (lowest) tier.
	DefaultTier string `yaml:"default_tier"`
	// Database is where tenants, keys and the audit log are stored.
	Database DatabaseConfig `yaml:"database"`
	// JWT configures JWT bearer credentials; off unless a key is configured.
	JWT JWTConfig `yaml:"jwt"`
	// Limits configures how tier limits are enforced.
	Limits LimitsConfig `yaml:"limits"`
	// Usage configures the usage ledger.
	Usage UsageConfig `yaml:"usage"`
	// Admin configures the bootstrap admin token.
	Admin AdminConfig `yaml:"admin"`
}

// DatabaseConfig names the SQL database of the Store.
type DatabaseConfig struct {
	// URL is `sqlite:PATH` (or a plain file path) for SQLite, `postgres://...` for PostgreSQL;
	// default DefaultDatabaseURL.
	URL string `yaml:"url"`
}

// DefaultDatabaseURL is the embedded default: SQLite in a file of the working directory.
const DefaultDatabaseURL = "sqlite:usher.db"

// TenantSpec declares one tenant in the config file.
type TenantSpec struct {
	// ID is the stable identifier: 1 to 64 characters of [A-Za-z0-9._-], unique.
	ID string `yaml:"id"`
	// Name is the human name; defaults to ID.
	Name string `yaml:"name"`
	// Tier names the tenant's SLA tier; defaults to Config.DefaultTier.
	Tier string `yaml:"tier"`
	// Keys are the tenant's API keys, by hash.
	Keys []KeySpec `yaml:"keys"`
}

// KeySpec declares one API key of a config tenant. The file holds only the hash of the key, never
// the key itself; `usher keyhash` prints the hash of a key.
type KeySpec struct {
	// Name identifies the key in logs and metrics (Principal.KeyID); defaults to "key-<index>".
	// Unique within the tenant.
	Name string `yaml:"name"`
	// SHA256 is the hex SHA-256 of the whole key string (HashKey), 64 hex characters.
	SHA256 string `yaml:"sha256"`
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// SetDefaults fills zero fields with their defaults. It never overwrites a set field.
func (c *Config) SetDefaults() {
	c.JWT.setDefaults()
	c.Limits.setDefaults()
	c.Usage.setDefaults()
	if c.Database.URL == "" {
		c.Database.URL = DefaultDatabaseURL
	}
	if len(c.Tiers) == 0 {
		c.Tiers = []Tier{{Name: BuiltinTier}}
	}
	for i := range c.Tiers {
		c.Tiers[i].setDefaults()
	}
	if c.DefaultTier == "" {
		c.DefaultTier = c.Tiers[len(c.Tiers)-1].Name
		for _, t := range c.Tiers {
			if t.Name == BuiltinTier {
				c.DefaultTier = BuiltinTier
			}
		}
	}
	for i := range c.Tenants {
		t := &c.Tenants[i]
		if t.Name == "" {
			t.Name = t.ID
		}
		if t.Tier == "" {
			t.Tier = c.DefaultTier
		}
		for j := range t.Keys {
			if t.Keys[j].Name == "" {
				t.Keys[j].Name = fmt.Sprintf("key-%d", j)
			}
		}
	}
}

// Validate reports every problem of the config, each naming its field, for example
// `tenants[0].keys[1].sha256: must be 64 hex characters`. Call it after SetDefaults.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if _, _, _, err := parseDatabaseURL(c.Database.URL); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.JWT.validate()...)
	errs = append(errs, c.Limits.validate()...)
	errs = append(errs, c.Usage.validate()...)
	errs = append(errs, c.Admin.validate()...)
	tiers := map[string]int{}
	for i := range c.Tiers {
		f := fmt.Sprintf("tiers[%d]", i)
		errs = append(errs, c.Tiers[i].validate(f)...)
		if prev, dup := tiers[c.Tiers[i].Name]; dup {
			bad(f+".name", "duplicate of tiers[%d].name %q", prev, c.Tiers[i].Name)
		} else {
			tiers[c.Tiers[i].Name] = i
		}
	}
	if _, ok := tiers[c.DefaultTier]; !ok {
		bad("default_tier", "names no tier in tiers: %q", c.DefaultTier)
	}
	ids := map[string]int{}
	hashes := map[string]string{}
	for i, t := range c.Tenants {
		f := fmt.Sprintf("tenants[%d]", i)
		switch {
		case t.ID == "":
			bad(f+".id", "must not be empty")
		case !idPattern.MatchString(t.ID):
			bad(f+".id", "must be 1 to 64 characters of A-Z a-z 0-9 . _ -")
		default:
			if prev, dup := ids[t.ID]; dup {
				bad(f+".id", "duplicate of tenants[%d].id %q", prev, t.ID)
			} else {
				ids[t.ID] = i
			}
		}
		if t.Name == "" {
			bad(f+".name", "must not be empty")
		}
		if _, ok := tiers[t.Tier]; !ok {
			bad(f+".tier", "names no tier in tiers: %q", t.Tier)
		}
		names := map[string]int{}
		for j, k := range t.Keys {
			kf := fmt.Sprintf("%s.keys[%d]", f, j)
			if k.Name == "" {
				bad(kf+".name", "must not be empty")
			} else if prev, dup := names[k.Name]; dup {
				bad(kf+".name", "duplicate of %s.keys[%d].name %q", f, prev, k.Name)
			} else {
				names[k.Name] = j
			}
			if !isHexHash(k.SHA256) {
				bad(kf+".sha256", "must be 64 hex characters")
				continue
			}
			h := strings.ToLower(k.SHA256)
			if prev, dup := hashes[h]; dup {
				bad(kf+".sha256", "same key as %s", prev)
			} else {
				hashes[h] = kf
			}
		}
	}
	return errors.Join(errs...)
}

func isHexHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}
