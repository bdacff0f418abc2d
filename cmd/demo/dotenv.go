package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/compose-spec/compose-go/v2/dotenv"
)

// composeVarPrefix starts the names of the variables docker-compose.yml
// reads (CHECKOUT_POSTGRES_PORT, ...): the ones the demo takes from compose's
// .env too. Others in .env are compose's business, not the demo's.
const composeVarPrefix = "CHECKOUT_"

// withComposeEnv returns getenv, which for a CHECKOUT_ variable it leaves
// unset falls back to the .env file beside the docker-compose.yml in dir or
// the nearest folder above it, read as compose reads it (compose-go's dotenv:
// quotes, comments, ${VAR} from the environment), so the demo finds the ports
// the stack was published on. The environment wins, as it does for compose
// (https://docs.docker.com/compose/how-tos/environment-variables/envvars-precedence/).
// No docker-compose.yml or no .env leaves getenv as it is; a .env compose
// could not read either is an error.
func withComposeEnv(getenv func(string) string, dir string) (func(string) string, error) {
	file, ok := composeEnvFile(dir)
	if !ok {
		return getenv, nil
	}
	f, err := os.Open(file)
	if errors.Is(err, fs.ErrNotExist) {
		return getenv, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	vars, err := dotenv.ParseWithLookup(f, func(k string) (string, bool) {
		v := getenv(k)
		return v, v != ""
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	return func(k string) string {
		if v := getenv(k); v != "" || !strings.HasPrefix(k, composeVarPrefix) {
			return v
		}
		return vars[k]
	}, nil
}

// composeEnvFile returns the .env path beside the docker-compose.yml in dir
// or the nearest folder above it.
func composeEnvFile(dir string) (string, bool) {
	for {
		if _, err := os.Stat(filepath.Join(dir, "docker-compose.yml")); err == nil {
			return filepath.Join(dir, ".env"), true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}
