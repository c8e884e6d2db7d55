package queue

import "fmt"

// Class is a priority class. Lower values are served first: Interactive before Standard before
// Batch. The zero value is Interactive.
type Class uint8

// The classes, highest priority first.
const (
	Interactive Class = iota
	Standard
	Batch
)

const numClasses = 3

// allClasses lists every class, highest priority first.
var allClasses = [numClasses]Class{Interactive, Standard, Batch}

// Classes returns every class, highest priority first: the one list of classes the other
// packages use.
func Classes() []Class { return append([]Class(nil), allClasses[:]...) }

var classNames = [numClasses]string{"interactive", "standard", "batch"}

// ParseClass reads a class name as written in config and headers: "interactive", "standard" or
// "batch".
func ParseClass(s string) (Class, error) {
	for i, n := range classNames {
		if s == n {
			return Class(i), nil
		}
	}
	return 0, fmt.Errorf("unknown class %q: want interactive, standard or batch", s)
}

// String returns the class name ParseClass reads.
func (c Class) String() string {
	if c.valid() {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// MarshalText writes the class name, so classes read well in JSON and YAML.
func (c Class) MarshalText() ([]byte, error) {
	if !c.valid() {
		return nil, fmt.Errorf("unknown class %d", uint8(c))
	}
	return []byte(c.String()), nil
}

// UnmarshalText reads a class name with ParseClass.
func (c *Class) UnmarshalText(b []byte) error {
	v, err := ParseClass(string(b))
	if err != nil {
		return err
	}
	*c = v
	return nil
}

func (c Class) valid() bool { return c < numClasses }
