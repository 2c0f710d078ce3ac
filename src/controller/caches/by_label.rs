//! [`ByLabel`]: an index of a cache's objects by one label's value, kept by the watch
//! itself.

use super::*;

/// A store's items by the value of one of their labels, kept from the same watch events
/// as the store (and, like the store, swapped whole at the end of a relist): a pass looks
/// its object's items up instead of scanning every item of the kind, so what a pass costs
/// does not grow with the number of objects.
#[derive(Clone)]
pub struct ByLabel {
    label: &'static str,
    inner: Arc<RwLock<LabelIndex>>,
}

#[derive(Default)]
struct LabelIndex {
    live: Keys,
    /// Filled during a relist (`Init` .. `InitDone`), then made `live`.
    relisting: Option<Keys>,
}

#[derive(Default)]
struct Keys {
    by_value: HashMap<String, BTreeSet<Key>>,
    value_of: HashMap<Key, String>,
}

impl Keys {
    fn insert(&mut self, key: Key, value: Option<String>) {
        self.remove(&key);
        if let Some(v) = value {
            self.by_value
                .entry(v.clone())
                .or_default()
                .insert(key.clone());
            self.value_of.insert(key, v);
        }
    }

    fn remove(&mut self, key: &Key) {
        let Some(v) = self.value_of.remove(key) else {
            return;
        };
        if let Some(keys) = self.by_value.get_mut(&v) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_value.remove(&v);
            }
        }
    }
}

impl ByLabel {
    /// An empty index of items by the value of `label`.
    pub fn new(label: &'static str) -> Self {
        Self {
            label,
            inner: Arc::default(),
        }
    }

    /// Takes in one watch event.
    pub fn apply<T: Resource>(&self, event: &watcher::Event<T>) {
        let key = |o: &T| {
            (
                o.meta().namespace.clone().unwrap_or_default(),
                o.meta().name.clone().unwrap_or_default(),
            )
        };
        let value = |o: &T| {
            o.meta()
                .labels
                .as_ref()
                .and_then(|l| l.get(self.label))
                .cloned()
        };
        let mut index = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Apply(o) => index.live.insert(key(o), value(o)),
            watcher::Event::Delete(o) => index.live.remove(&key(o)),
            watcher::Event::Init => index.relisting = Some(Keys::default()),
            watcher::Event::InitApply(o) => index
                .relisting
                .get_or_insert_with(Keys::default)
                .insert(key(o), value(o)),
            watcher::Event::InitDone => {
                if let Some(keys) = index.relisting.take() {
                    index.live = keys;
                }
            }
        }
    }

    /// The items of `store` whose label has `value`.
    pub fn get<T>(&self, store: &Store<T>, value: &str) -> Vec<Arc<T>>
    where
        T: Resource + Clone,
        T::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let keys: Vec<Key> = {
            let index = self.inner.read().unwrap_or_else(PoisonError::into_inner);
            index
                .live
                .by_value
                .get(value)
                .map(|keys| keys.iter().cloned().collect())
                .unwrap_or_default()
        };
        keys.into_iter()
            .filter_map(|(ns, name)| {
                let r = reflector::ObjectRef::<T>::new(&name);
                store.get(&if ns.is_empty() { r } else { r.within(&ns) })
            })
            // The store is written just after the index: a change in between reads as
            // the store has it.
            .filter(|i| i.labels().get(self.label).map(String::as_str) == Some(value))
            .collect()
    }
}
