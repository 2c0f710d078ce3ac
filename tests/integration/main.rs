//! The one integration-test binary (each test binary links kube again, so there is one).

mod testserver_smoke;
